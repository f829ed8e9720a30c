"""Why answers that hold the right answer do not stop: on finished strata runs, every `no_stop` answer of each method
set beside standard decoding's answer on the same row (the context path alone), by cause (`fides_rag.eval.failures`):

- standard_runs_on: standard does not stop there either (its answer is `no_stop` too, or ran to the token limit);
- past_standard_end: the answer holds standard's tokens up to standard's end token and goes on (the contrast
  overrode the end the context path chose: what a stop-aware variant prevents);
- diverged_first: it left standard's tokens before standard's end.

No model runs: the rows, their strata and their passages are read again from each run folder and its dataset.

    python benchmarks/no_stop_anatomy.py results/eval/gemma3-bigbench-strata results/eval/qwen05-bigbench-strata \\
        results/eval/qwen15-bigbench-strata --methods fides,fides-stop --out results/no-stop-anatomy/bigbench.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def step_ids(output: Mapping[str, Any]) -> list[int]:
    return [step["token_id"] for step in output["steps"]]


def anatomy(run: str | Path, methods: Sequence[str] | None) -> dict[str, Any]:
    """stratum -> method -> rows, no_stop answers and their causes, for one strata run folder."""
    from fides_rag.eval.failures import NO_STOP_CAUSES, answer_class, no_stop_cause
    from fides_rag.eval.strata import REFERENCE, STRATA
    from fides_rag.eval.strata_run import read_strata_rows

    rows = read_strata_rows(run)
    labels = [m for m in (methods or rows.labels) if m != REFERENCE]
    unknown = [m for m in labels if m not in rows.labels]
    if unknown:
        raise ValueError(f"{run} has no answers of {', '.join(unknown)}; its methods are {', '.join(rows.labels)}")
    examples = {e.id: e for e in rows.examples}

    def classify(record: Mapping[str, Any], label: str) -> str:
        e = examples[record["id"]]
        return answer_class(record["outputs"][label]["text"], e.context_answers, e.memory_answers, e.contexts)

    out: dict[str, Any] = {}
    for stratum in STRATA:
        records = [r for r in rows.records if rows.strata.get(r["id"]) == stratum and REFERENCE in r["outputs"]]
        out[stratum] = {}
        for label in labels:
            paired = [r for r in records if label in r["outputs"]]
            causes = dict.fromkeys(NO_STOP_CAUSES, 0)
            for record in paired:
                if classify(record, label) != "no_stop":
                    continue
                standard = record["outputs"][REFERENCE]
                cause = no_stop_cause(
                    step_ids(record["outputs"][label]),
                    step_ids(standard),
                    classify(record, REFERENCE),
                    standard["finish_reason"],
                )
                causes[cause] += 1
            out[stratum][label] = {"rows": len(paired), "no_stop": sum(causes.values()), "causes": causes}
    return out


def table(report: Mapping[str, Any]) -> str:
    """One markdown row per run, stratum and method (strata where the method has a no_stop answer or rows)."""
    lines = [
        "| run | stratum | method | rows | no_stop | standard runs on | past standard's end | diverged first |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, strata in report["runs"].items():
        for stratum, methods in strata.items():
            for label, cell in methods.items():
                if not cell["rows"]:
                    continue
                c = cell["causes"]
                lines.append(
                    f"| {Path(run).name} | {stratum} | {label} | {cell['rows']} | {cell['no_stop']} | "
                    f"{c['standard_runs_on']} | {c['past_standard_end']} | {c['diverged_first']} |"
                )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="finished `fides-rag eval --strata` run folders")
    parser.add_argument("--methods", help="comma-separated method labels (default: every one but standard)")
    parser.add_argument("--out", help="results JSON (the table is printed either way)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    methods = args.methods.split(",") if args.methods else None
    try:
        report = {"runs": {run: anatomy(run, methods) for run in args.runs}}
    except ValueError as err:
        sys.exit(f"no_stop_anatomy.py: error: {err}")
    print(table(report))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
