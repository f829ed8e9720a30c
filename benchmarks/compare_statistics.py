"""Compare the statistics two revisions write for the same eval predictions (metrics, bootstrap CIs, p-values,
analyses), e.g. after changing the statistics code.

Make one run with the new code, copy it without its statistics, and let the other revision resume the copy: it
decodes nothing (the predictions are all there) and only rewrites results.json and the analyses.

    fides-rag eval --model smollm2-135m-instruct --dataset nq-swap --limit 60 --methods standard,cad,adacad,fides \\
        --max-new-tokens 16 --device cpu --out NEW --analyze
    cp -r NEW OLD && rm -r OLD/analysis OLD/results.*
    git worktree add /tmp/old REV
    (cd /tmp/old && PYTHONPATH=/tmp/old python -m fides_rag.cli.main eval <the same arguments> --out OLD --analyze)
    python benchmarks/compare_statistics.py NEW OLD --out report.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def compare(new: Path, old: Path) -> dict:
    """What differs between two run folders' statistics computed on the same predictions."""
    n, o = (json.loads((p / "results.json").read_text()) for p in (new, old))
    if o["run"]["decoded_now"] != 0:
        raise SystemExit(f"compare_statistics: {old} decoded examples again, so its predictions are not those of {new}")
    key = lambda c: (c["a"], c["b"], c["metric"])  # noqa: E731
    old_tests = {key(c): c for c in o["significance"]}
    pairs = [(c, old_tests[key(c)]) for c in n["significance"]]
    return {
        "examples": n["run"]["examples"],
        "metrics_identical": n["metrics"] == o["metrics"],
        "comparisons": len(pairs),
        "max_abs_change_diff": max(abs(a["diff"] - b["diff"]) for a, b in pairs),
        "max_abs_change_ci_bound": max(
            max(abs(a["ci_low"] - b["ci_low"]), abs(a["ci_high"] - b["ci_high"])) for a, b in pairs
        ),
        "p_values_new_vs_old": [[list(key(a)), round(a["p_value"], 3), round(b["p_value"], 3)] for a, b in pairs],
        "analyses_identical": {
            f.name: json.loads(f.read_text()) == json.loads((old / "analysis" / f.name).read_text())
            for f in sorted((new / "analysis").glob("*.json"))
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("new", type=Path, help="run folder whose statistics the new code wrote")
    parser.add_argument("old", type=Path, help="a copy of it whose statistics the other revision rewrote")
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args(argv)
    report = compare(args.new, args.old)
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
