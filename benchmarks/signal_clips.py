"""How often each FIDES signal sits at its clip, and the range alpha takes, per method of an eval run.

FIDES clips Shift and Noise to [0, 1] after scaling them; a signal at its clip on most tokens carries no information,
and alpha then sits near a floor. This reads the per-step records of a run's `predictions.jsonl` (every method that
recorded `alpha`) and reports, per method: the answer tokens, the share of tokens at each signal's clip (within 1e-6
of 1), each signal's median, and alpha's quartiles. No model runs.

    python benchmarks/signal_clips.py results/eval/gemma3-bigbench-strata \
        --out results/signal-clips/gemma3-bigbench.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fides_rag.eval.records import read_predictions

SIGNALS = ("opposition", "shift", "noise")
CLIP = 1.0 - 1e-6


def _quartiles(values: Sequence[float]) -> list[float] | None:
    if len(values) < 2:
        return [values[0]] * 3 if values else None
    return [round(q, 4) for q in statistics.quantiles(values, n=4, method="inclusive")]


def method_clips(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The clip shares, signal medians and alpha quartiles of one method's recorded steps."""
    out: dict[str, Any] = {"tokens": len(steps), "alpha_quartiles": _quartiles([s["alpha"] for s in steps])}
    for name in SIGNALS:
        values = [s[name] for s in steps if s.get(name) is not None]
        if not values:
            continue
        out[name] = {
            "at_clip": round(sum(v >= CLIP for v in values) / len(values), 4),
            "median": round(statistics.median(values), 4),
        }
    return out


def run_clips(run: Path) -> dict[str, Any]:
    """method -> `method_clips`, for every method of `run` that recorded alpha on its steps."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for record in read_predictions(run / "predictions.jsonl"):
        for label, output in record["outputs"].items():
            steps = [s for s in output.get("steps", []) if s.get("alpha") is not None]
            by_method.setdefault(label, []).extend(steps)
    return {label: method_clips(steps) for label, steps in by_method.items() if steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an eval run folder (holds predictions.jsonl)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not (args.run / "predictions.jsonl").is_file():
        parser.error(f"{args.run} holds no predictions.jsonl: give an eval run folder")
    result = {"run": str(args.run), "methods": run_clips(args.run)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
