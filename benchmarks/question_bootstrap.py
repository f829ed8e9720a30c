"""Confidence intervals by row and by question for the committed NQ-Swap runs of the scale table.

NQ-Swap asks one question on several rows (its passage swapped in different ways), so rows are not independent and
the paired bootstrap over rows, which `fides-rag eval` writes by default, gives intervals that are too narrow. This
recomputes FIDES's differences from each run's predictions both ways (`fides_rag.eval.harness.summarize`, 1,000
resamples, seed 0): over rows, and over questions with all their rows (`--bootstrap-by question`).

    python benchmarks/question_bootstrap.py --out results/question-bootstrap/nq-swap.json   # prints the markdown table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fides_rag.eval.harness import summarize
from fides_rag.eval.records import read_predictions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_trend import BACKBONES, RESULTS

COMPARED = {"conflict": ("cf", ("standard", "cad", "adacad")), "no-conflict": ("em", ("standard",))}
"""Per slice: the metric and the methods FIDES is compared with (those of the scale table)."""


def intervals(
    run: str, metric: str, others: tuple[str, ...], samples: int, root: Path = RESULTS
) -> dict[str, Any] | None:
    """FIDES − each other method on `metric`, with the row and the question interval, from one run's predictions."""
    path = root / run / "predictions.jsonl"
    if not path.is_file():
        return None
    records = read_predictions(path)
    labels = [m for m in ("fides", *others) if all(m in r["outputs"] for r in records)]
    by = {
        unit: summarize(records, labels, bootstrap_samples=samples, bootstrap_by=unit) for unit in ("row", "question")
    }
    out: dict[str, Any] = {
        "run": run,
        "rows": len(records),
        "questions": len({r["question"] for r in records}),
        "metric": metric,
        "comparisons": {},
    }
    for other in labels[1:]:
        tests = {unit: _fides_minus(found["significance"], other, metric) for unit, found in by.items()}
        out["comparisons"][other] = {"diff": tests["row"]["diff"], "row": tests["row"], "question": tests["question"]}
    return out


def _fides_minus(significance: list[dict[str, Any]], other: str, metric: str) -> dict[str, Any]:
    """The test of fides − other on `metric`, signed that way round."""
    test = next(c for c in significance if {c["a"], c["b"]} == {"fides", other} and c["metric"] == metric)
    sign = 1 if test["a"] == "fides" else -1
    low, high = sorted((sign * test["ci_low"], sign * test["ci_high"]))
    return {
        "diff": sign * test["diff"],
        "ci_low": low,
        "ci_high": high,
        "p_value": test["p_value"],
        "n": test["n"],
        "clusters": test["clusters"],
    }


def table(report: list[dict[str, Any]]) -> str:
    lines = [
        "| backbone | slice | rows (questions) | FIDES − | diff | 95% CI over rows | 95% CI over questions | width "
        "ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in report:
        for other, c in entry["comparisons"].items():
            row, question = c["row"], c["question"]
            ratio = (
                (question["ci_high"] - question["ci_low"]) / (row["ci_high"] - row["ci_low"])
                if row["ci_high"] > row["ci_low"]
                else float("nan")
            )
            lines.append(
                f"| {entry['backbone']} | {entry['slice']} ({entry['metric'].upper()}) | {entry['rows']} "
                f"({entry['questions']}) | "
                f"{other} | {c['diff']:+.1f} | [{row['ci_low']:+.1f}, {row['ci_high']:+.1f}] | "
                f"[{question['ci_low']:+.1f}, {question['ci_high']:+.1f}] | {ratio:.2f}x |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="JSON file for every interval (default: print only)")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap resamples (default: %(default)s)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the eval runs (default: results/eval)")
    args = parser.parse_args(argv)
    report = []
    for backbone in BACKBONES:
        for slice_name, run in (("conflict", backbone.conflict_run), ("no-conflict", backbone.original_run)):
            metric, others = COMPARED[slice_name]
            found = intervals(run, metric, others, args.samples, args.results)
            if found is not None:
                report.append({"backbone": backbone.size, "slice": slice_name, **found})
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"samples": args.samples, "seed": 0, "runs": report}, indent=2) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
