"""The scale trend: NQ-Swap faithfulness of each method on four backbones, 135M to 1.5B, from the committed eval runs.

Reads `results/eval/<run>/results.json` (written by `fides-rag eval`) for the conflict rows (`--dataset nq-swap`)
and the no-conflict rows (`--dataset nq-swap-original`) of each backbone, and prints markdown:

    python benchmarks/scale_trend.py            # the headline table (README)
    python benchmarks/scale_trend.py --full     # CF, Acc and MemR of every method, and the no-conflict slice (docs)

Differences are FIDES minus the other method in points, with the paired-bootstrap 95% CI that the eval wrote.
The no-conflict loss is FIDES's EM and token F1 minus standard's on the unswapped rows (where passage and memory
agree); F1 still moves where long answers keep every exact match at 0.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results" / "eval"
METHODS = ("standard", "cad", "adacad", "fides", "coiecd")
SMALL_N = 100


@dataclass(frozen=True)
class Backbone:
    size: str
    name: str
    conflict_run: str
    original_run: str


BACKBONES = (
    Backbone("135M", "SmolLM2-135M-Instruct", "smollm2-nqswap", "smollm2-nqswap-original"),
    Backbone("270M", "gemma3-270m", "gemma3-nqswap", "gemma3-nqswap-original"),
    Backbone("0.5B", "Qwen2.5-Coder-0.5B-Instruct", "qwen05-nqswap", "qwen05-nqswap-original"),
    Backbone("1.5B", "Qwen2.5-Coder-1.5B-Instruct", "qwen15-nqswap", "qwen15-nqswap-original"),
)


def load(run: str, root: Path = RESULTS) -> dict | None:
    path = root / run / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def n_of(results: dict | None) -> int:
    return 0 if results is None else int(results["run"]["examples"])


def metric(results: dict | None, method: str, name: str) -> str:
    if results is None or method not in results["metrics"] or results["metrics"][method][name] is None:
        return "–"
    return f"{results['metrics'][method][name]:.1f}"


def difference(results: dict | None, metric_name: str, other: str, reference: str = "fides") -> str:
    """`reference − other` on `metric_name` with its 95% CI, as "+1.2 [−0.4, +2.8]", or "–"."""
    if results is None:
        return "–"
    for c in results["significance"]:
        if {c["a"], c["b"]} == {reference, other} and c["metric"] == metric_name:
            sign = 1 if c["a"] == reference else -1
            low, high = sorted((sign * c["ci_low"] + 0.0, sign * c["ci_high"] + 0.0))
            return f"{sign * c['diff'] + 0.0:+.1f} [{low:+.1f}, {high:+.1f}]"
    return "–"


def n_label(n: int) -> str:
    return "not run" if n == 0 else f"{n} (small n)" if n < SMALL_N else str(n)


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def headline(root: Path = RESULTS) -> str:
    head = ["backbone", "n conflict", "CF standard", "CF AdaCAD", "CF FIDES", "FIDES − standard", "FIDES − AdaCAD",
            "n no-conflict", "no-conflict: FIDES − standard, EM", "F1"]
    rows = []
    for b in BACKBONES:
        conflict, original = load(b.conflict_run, root), load(b.original_run, root)
        rows.append([f"{b.name} ({b.size})", n_label(n_of(conflict)), metric(conflict, "standard", "cf"),
                     metric(conflict, "adacad", "cf"), metric(conflict, "fides", "cf"),
                     difference(conflict, "cf", "standard"), difference(conflict, "cf", "adacad"),
                     n_label(n_of(original)), difference(original, "em", "standard"), difference(original, "f1", "standard")])
    return table(head, rows)


def full(root: Path = RESULTS) -> str:
    head = ["backbone", "n"] + [f"{m} CF / Acc / MemR" for m in METHODS]
    conflict_rows, original_rows = [], []
    for b in BACKBONES:
        conflict, original = load(b.conflict_run, root), load(b.original_run, root)
        conflict_rows.append([b.size, n_label(n_of(conflict))] + [
            " / ".join(metric(conflict, m, k) for k in ("cf", "accuracy", "memorized")) for m in METHODS])
        original_rows.append([b.size, n_label(n_of(original))] + [
            f"{metric(original, m, 'em')} / {metric(original, m, 'accuracy')}" for m in METHODS]
            + [" ; ".join(f"{m} {difference(original, 'em', 'standard', reference=m)}" for m in METHODS if m != "standard")])
    original_head = ["backbone", "n"] + [f"{m} EM / Acc" for m in METHODS] + ["EM − standard [95% CI]"]
    return "\n\n".join([
        "Conflict rows (NQ-Swap, swapped passage): CF, Acc and MemR in %.", table(head, conflict_rows),
        "No-conflict rows (NQ-Swap's original passage and answer): EM and Acc in %, and each method's EM minus "
        "standard's with its paired-bootstrap 95% CI.", table(original_head, original_rows),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="every method's CF, Acc and MemR, and the no-conflict slice")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder holding the eval runs")
    args = parser.parse_args()
    print(full(args.results) if args.full else headline(args.results))


if __name__ == "__main__":
    main()
