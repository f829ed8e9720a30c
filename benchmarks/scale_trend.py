"""The scale trend: NQ-Swap faithfulness of each method, gated or not, on four backbones, 135M to 1.5B, from the
committed eval runs.

Reads `results/eval/<run>/results.json` (written by `fides-rag eval`) for the conflict rows (`--dataset nq-swap`)
and the no-conflict rows (`--dataset nq-swap-original`) of each backbone, and prints markdown:

    python benchmarks/scale_trend.py            # the headline table (README): CF and no-conflict EM, FIDES gated or not
    python benchmarks/scale_trend.py --gates    # each method against standard and AdaCAD with CIs, its contrasted share
    python benchmarks/scale_trend.py --full     # CF, Acc and MemR of every method, and the no-conflict slice (docs)
    python benchmarks/scale_trend.py --targets  # the do-no-harm targets, met or not, with the figures

Differences are a method minus standard (or AdaCAD) in points, with the paired-bootstrap 95% CI that the eval
wrote (over questions, each with all its rows, unless the run says rows). Three states: correction is CF on the
conflict rows (the swapped passage is right), agreement is EM on the no-conflict rows (passage and memory agree),
resistance is MemR on the conflict rows (the share that kept the memorised answer against the passage).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results" / "eval"
METHODS = ("standard", "cad", "adacad", "fides", "coiecd", "fides+agree", "fides+nwcad", "fides+defer", "adacad+agree")
HEADLINE_METHODS = ("standard", "adacad", "fides", "fides+agree", "fides+nwcad")
GATED_FIDES = ("fides+agree", "fides+nwcad", "fides+defer")
SMALL_N = 100


@dataclass(frozen=True)
class Backbone:
    size: str
    name: str
    conflict_run: str
    original_run: str


BACKBONES = (
    Backbone("135M", "SmolLM2-135M-Instruct", "smollm2-nqswap-gated", "smollm2-nqswap-original"),
    Backbone("270M", "gemma3-270m", "gemma3-nqswap-gated", "gemma3-nqswap-original"),
    Backbone("0.5B", "Qwen2.5-Coder-0.5B-Instruct", "qwen05-nqswap", "qwen05-nqswap-original"),
    Backbone("1.5B", "Qwen2.5-Coder-1.5B-Instruct", "qwen15-nqswap", "qwen15-nqswap-original"),
)


def load(run: str, root: Path = RESULTS) -> dict | None:
    path = root / run / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def n_of(results: dict | None) -> int:
    return 0 if results is None else int(results["run"]["examples"])


def metric(results: dict | None, method: str, name: str) -> str:
    if results is None or method not in results["metrics"] or results["metrics"][method].get(name) is None:
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
    """One row per backbone: CF on the conflict rows and EM on the no-conflict rows, standard and FIDES gated or not."""
    shown = HEADLINE_METHODS
    names = {"standard": "standard", "adacad": "AdaCAD", "fides": "FIDES", **{m: "+" + m.split("+")[1] for m in GATED_FIDES}}
    head = (["backbone", "n"] + [f"CF {names[m]}" for m in shown] + [f"no-conflict EM {names[m]}" for m in shown])
    rows = []
    for b in BACKBONES:
        conflict, original = load(b.conflict_run, root), load(b.original_run, root)
        rows.append([f"{b.name} ({b.size})", f"{n_label(n_of(conflict))} / {n_label(n_of(original))}"]
                    + [metric(conflict, m, "cf") for m in shown] + [metric(original, m, "em") for m in shown])
    return table(head, rows)


def gates(root: Path = RESULTS) -> str:
    head = ["backbone, n conflict / no-conflict", "method", "CF", "CF − standard", "CF − AdaCAD", "no-conflict EM",
            "EM − standard", "contrasted %"]
    rows = []
    for b in BACKBONES:
        conflict, original = load(b.conflict_run, root), load(b.original_run, root)
        label = f"{b.name} ({b.size}), n {n_label(n_of(conflict))} / {n_label(n_of(original))}"
        for m in ("standard", "adacad", "fides", *GATED_FIDES):
            if m != "standard" and not has(conflict, m) and not has(original, m):
                continue
            rows.append([label if m == "standard" else "", m, metric(conflict, m, "cf"),
                         "" if m == "standard" else difference(conflict, "cf", "standard", reference=m),
                         "" if m in ("standard", "adacad") else difference(conflict, "cf", "adacad", reference=m),
                         metric(original, m, "em"), "" if m == "standard" else difference(original, "em", "standard", reference=m),
                         metric(conflict, m, "share_contrasted")])
    return table(head, rows)


def has(results: dict | None, method: str) -> bool:
    return results is not None and method in results["metrics"]


def value(results: dict | None, method: str, name: str) -> float | None:
    return results["metrics"][method].get(name) if has(results, method) else None


def comparison(results: dict | None, metric_name: str, method: str, other: str) -> dict | None:
    """`method − other` on `metric_name`: diff, ci_low, ci_high (signed), or None."""
    for c in (results or {}).get("significance", []):
        if {c["a"], c["b"]} == {method, other} and c["metric"] == metric_name:
            sign = 1 if c["a"] == method else -1
            low, high = sorted((sign * c["ci_low"] + 0.0, sign * c["ci_high"] + 0.0))
            return {"diff": sign * c["diff"] + 0.0, "ci_low": low, "ci_high": high}
    return None


def targets(root: Path = RESULTS) -> str:
    """The do-no-harm targets per backbone and gated FIDES: met or not, with the measured figures."""
    head = ["backbone", "method", "no-conflict EM − standard (≥ −2; CI low ≥ −5)", "CF gain kept (≥ 80% where FIDES gains, else ≥ standard)",
            "met"]
    rows = []
    for b in BACKBONES:
        conflict, original = load(b.conflict_run, root), load(b.original_run, root)
        fides_gain = comparison(conflict, "cf", "fides", "standard")
        for m in GATED_FIDES:
            loss, gain = comparison(original, "em", m, "standard"), comparison(conflict, "cf", m, "standard")
            if loss is None or gain is None or fides_gain is None:
                rows.append([b.size, m, "not run", "not run", "–"])
                continue
            harmless = loss["diff"] >= -2 and loss["ci_low"] >= -5
            if fides_gain["diff"] > 0:
                kept = gain["diff"] / fides_gain["diff"]
                correcting, kept_text = kept >= 0.8, f"{100 * kept:.0f}% of {fides_gain['diff']:+.1f} ({gain['diff']:+.1f})"
            else:
                correcting, kept_text = gain["diff"] >= 0, f"FIDES {fides_gain['diff']:+.1f}; gated {gain['diff']:+.1f}"
            rows.append([b.size, m, f"{loss['diff']:+.1f} [{loss['ci_low']:+.1f}, {loss['ci_high']:+.1f}]", kept_text,
                         "yes" if harmless and correcting else "no"])
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
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--gates", action="store_true", help="each method against standard and AdaCAD with CIs, and its contrasted share")
    shown.add_argument("--full", action="store_true", help="every method's CF, Acc and MemR, and the no-conflict slice")
    shown.add_argument("--targets", action="store_true", help="the do-no-harm targets of gated FIDES, met or not")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder holding the eval runs")
    args = parser.parse_args()
    shown = full if args.full else targets if args.targets else gates if args.gates else headline
    print(shown(args.results))


if __name__ == "__main__":
    main()
