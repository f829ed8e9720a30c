"""Print the 1- vs 2-process table of a measure.sh run folder and save it as JSON beside this script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

run = Path(sys.argv[1])
rows = {}
for name in ("one", "two"):
    results = json.loads((run / name / "results.json").read_text())
    rows[name] = {"processes": results["run"].get("processes", 1), "examples": results["run"]["decoded_now"],
                  "seconds": results["run"]["seconds_now"], "examples_per_second": results["run"]["examples_per_second_now"],
                  "metrics": {m: {k: v[k] for k in ("cf", "em", "f1", "accuracy")} for m, v in results["metrics"].items()}}
same = rows["one"]["metrics"] == rows["two"]["metrics"]
print("| processes | threads each | examples | seconds (decode, wall) | examples/s |\n|---|---|---|---|---|")
for name, threads in (("one", 2), ("two", 1)):
    r = rows[name]
    print(f"| {r['processes']} | {threads} | {r['examples']} | {r['seconds']:.1f} | {r['examples_per_second']:.3f} |")
print(f"\n2 processes / 1 process: {rows['two']['examples_per_second'] / rows['one']['examples_per_second']:.2f}x; same metrics: {same}")
(Path(__file__).parent / f"{run.name}.json").write_text(json.dumps({**rows, "same_metrics": same}, indent=2) + "\n")
