"""The scale trend: NQ-Swap (and BIG-bench conflicts) faithfulness of each method, gated or not, on four backbones,
135M to 1.5B, from the committed eval runs.

Reads `results/eval/<run>/results.json` (written by `fides-rag eval`) for the conflict rows (`--dataset nq-swap`)
and the no-conflict rows (`--dataset nq-swap-original`) of each backbone, and prints markdown:

    python benchmarks/scale_trend.py            # the scale-trend table: CF and no-conflict EM, FIDES gated or not
    python benchmarks/scale_trend.py --gates    # each method against standard and AdaCAD with CIs, its contrasted share
    python benchmarks/scale_trend.py --full     # CF, Acc and MemR of every method, and the no-conflict slice (docs)
    python benchmarks/scale_trend.py --targets  # the do-no-harm targets, met or not, with the figures
    python benchmarks/scale_trend.py --strata --json     # per backbone, stratum, method: n, questions, score,
                                                         # regressions, CI, failures by class
    python benchmarks/scale_trend.py --strata --json --dataset bigbench-conflicts   # the same on BIG-bench conflicts
    python benchmarks/scale_trend.py --strata --targets  # the true-conflict targets, held or not
    python benchmarks/scale_trend.py --strata --headline # the README's table: true-conflict CF, known-agreeing EM
    python benchmarks/scale_trend.py --strata --headline --dataset bigbench-conflicts   # its BIG-bench table
    python benchmarks/scale_trend.py --strata --failures # the wrong answers by class, per backbone, stratum, method

With --strata it reads each backbone's strata run (`fides-rag eval --dataset nq-swap-both --strata`, see
docs/evaluation.md), `results/eval/<backbone>-nqswap-strata`, or with `--dataset bigbench-conflicts` the run of
`--dataset bigbench-conflicts-both`, `results/eval/<backbone>-bigbench-strata`: rows split by the passage (swapped or
original) and by whether the backbone knew the original answer closed-book; true_conflict rows are the real conflicts.
Each cell of --json has `questions` (distinct) beside `n` (rows) and `failures`, the wrong answers by class
(`fides_rag.eval.failures`): results written before they were counted are read again from the run folder's answers
and its dataset (no model runs); where that cannot be done they are null, with a note on stderr.

Differences are a method minus standard (or AdaCAD) in points, with the paired-bootstrap 95% CI that the eval
wrote (over questions, each with all its rows, unless the run says rows). Three states: correction is CF on the
conflict rows (the swapped passage is right), agreement is EM on the no-conflict rows (passage and memory agree),
resistance is MemR on the conflict rows (the share that kept the memorised answer against the passage).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results" / "eval"
METHODS = ("standard", "cad", "adacad", "fides", "coiecd", "fides+agree", "fides+nwcad", "fides+defer", "adacad+agree")
HEADLINE_METHODS = ("standard", "adacad", "fides", "fides+agree", "fides+nwcad")
GATED_FIDES = ("fides+agree", "fides+nwcad", "fides+defer")
SMALL_N = 100


STRATA_DATASETS = {"nq-swap": "nqswap", "bigbench-conflicts": "bigbench"}
"""--dataset with --strata -> the tag of its strata run folders, <backbone key>-<tag>-strata."""


@dataclass(frozen=True)
class Backbone:
    size: str
    name: str
    conflict_run: str
    original_run: str
    key: str
    """The prefix of its run folders."""

    def strata_run(self, dataset: str = "nq-swap") -> str:
        """The folder of its strata run on `dataset` (a key of STRATA_DATASETS)."""
        return f"{self.key}-{STRATA_DATASETS[dataset]}-strata"


BACKBONES = (
    Backbone("135M", "SmolLM2-135M-Instruct", "smollm2-nqswap-gated", "smollm2-nqswap-original", "smollm2"),
    Backbone("270M", "gemma3-270m", "gemma3-nqswap-gated", "gemma3-nqswap-original", "gemma3"),
    Backbone("0.5B", "Qwen2.5-Coder-0.5B-Instruct", "qwen05-nqswap", "qwen05-nqswap-original", "qwen05"),
    Backbone("1.5B", "Qwen2.5-Coder-1.5B-Instruct", "qwen15-nqswap", "qwen15-nqswap-original", "qwen15"),
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
    names = {
        "standard": "standard",
        "adacad": "AdaCAD",
        "fides": "FIDES",
        **{m: "+" + m.split("+")[1] for m in GATED_FIDES},
    }
    head = ["backbone", "n"] + [f"CF {names[m]}" for m in shown] + [f"no-conflict EM {names[m]}" for m in shown]
    rows = []
    for b in BACKBONES:
        conflict, original = load(b.conflict_run, root), load(b.original_run, root)
        rows.append(
            [f"{b.name} ({b.size})", f"{n_label(n_of(conflict))} / {n_label(n_of(original))}"]
            + [metric(conflict, m, "cf") for m in shown]
            + [metric(original, m, "em") for m in shown]
        )
    return table(head, rows)


def gates(root: Path = RESULTS) -> str:
    head = [
        "backbone, n conflict / no-conflict",
        "method",
        "CF",
        "CF − standard",
        "CF − AdaCAD",
        "no-conflict EM",
        "EM − standard",
        "contrasted %",
    ]
    rows = []
    for b in BACKBONES:
        conflict, original = load(b.conflict_run, root), load(b.original_run, root)
        label = f"{b.name} ({b.size}), n {n_label(n_of(conflict))} / {n_label(n_of(original))}"
        for m in ("standard", "adacad", "fides", *GATED_FIDES):
            if m != "standard" and not has(conflict, m) and not has(original, m):
                continue
            rows.append(
                [
                    label if m == "standard" else "",
                    m,
                    metric(conflict, m, "cf"),
                    "" if m == "standard" else difference(conflict, "cf", "standard", reference=m),
                    "" if m in ("standard", "adacad") else difference(conflict, "cf", "adacad", reference=m),
                    metric(original, m, "em"),
                    "" if m == "standard" else difference(original, "em", "standard", reference=m),
                    metric(conflict, m, "share_contrasted"),
                ]
            )
    return table(head, rows)


def has(results: dict | None, method: str) -> bool:
    return results is not None and method in results["metrics"]


def value(results: dict | None, method: str, name: str) -> float | None:
    return results["metrics"][method].get(name) if results is not None and has(results, method) else None


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
    head = [
        "backbone",
        "method",
        "no-conflict EM − standard (≥ −2; CI low ≥ −5)",
        "CF gain kept (≥ 80% where FIDES gains, else ≥ standard)",
        "met",
    ]
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
                correcting, kept_text = (
                    kept >= 0.8,
                    f"{100 * kept:.0f}% of {fides_gain['diff']:+.1f} ({gain['diff']:+.1f})",
                )
            else:
                correcting, kept_text = gain["diff"] >= 0, f"FIDES {fides_gain['diff']:+.1f}; gated {gain['diff']:+.1f}"
            rows.append(
                [
                    b.size,
                    m,
                    f"{loss['diff']:+.1f} [{loss['ci_low']:+.1f}, {loss['ci_high']:+.1f}]",
                    kept_text,
                    "yes" if harmless and correcting else "no",
                ]
            )
    return table(head, rows)


def full(root: Path = RESULTS) -> str:
    head = ["backbone", "n"] + [f"{m} CF / Acc / MemR" for m in METHODS]
    conflict_rows, original_rows = [], []
    for b in BACKBONES:
        conflict, original = load(b.conflict_run, root), load(b.original_run, root)
        conflict_rows.append(
            [b.size, n_label(n_of(conflict))]
            + [" / ".join(metric(conflict, m, k) for k in ("cf", "accuracy", "memorized")) for m in METHODS]
        )
        original_rows.append(
            [b.size, n_label(n_of(original))]
            + [f"{metric(original, m, 'em')} / {metric(original, m, 'accuracy')}" for m in METHODS]
            + [
                " ; ".join(
                    f"{m} {difference(original, 'em', 'standard', reference=m)}" for m in METHODS if m != "standard"
                )
            ]
        )
    original_head = ["backbone", "n"] + [f"{m} EM / Acc" for m in METHODS] + ["EM − standard [95% CI]"]
    return "\n\n".join(
        [
            "Conflict rows (NQ-Swap, swapped passage): CF, Acc and MemR in %.",
            table(head, conflict_rows),
            "No-conflict rows (NQ-Swap's original passage and answer): EM and Acc in %, and each method's EM minus "
            "standard's with its paired-bootstrap 95% CI.",
            table(original_head, original_rows),
        ]
    )


# -- strata (true conflicts) -----------------------------------------------------------------------

STRATA = ("true_conflict", "supplied", "known_agreeing", "unknown_agreeing")
TRUE_CONFLICT_ROWS = 300
"""Target: at least this many true-conflict rows per backbone, or every one available."""
BACKBONES_TO_WIN = 3
"""Target: FIDES or the recommended variant beats standard on true-conflict CF (CI above 0) on this many backbones."""
EM_SLACK = 1.0
"""Target: the recommended variant's known-agreeing EM is at least standard's minus this many points ..."""
REGRESSION_SHARE = 3.0
"""... and its regressions there are at most this % of the rows standard gets right."""
STOP_SHARE = Fraction(1, 3)
"""Target: the stop-aware variant's answers that do not stop are at most this share of FIDES's."""


@dataclass(frozen=True)
class StrataTargets:
    """What a dataset's strata runs are held to."""

    backbones: tuple[str, ...]
    """The backbones the targets count."""
    wins_needed: int
    """Backbones on which a method beats standard on true-conflict CF with the CI above 0."""
    any_variant: bool
    """True: any method may win; False: FIDES or the recommended variant."""
    stop_variant: str | None = None
    """With its no_stop answers (every stratum) at most STOP_SHARE of FIDES's, on every backbone counted."""


STRATA_TARGETS = {
    "nq-swap": StrataTargets(tuple(b.name for b in BACKBONES), BACKBONES_TO_WIN, any_variant=False),
    "bigbench-conflicts": StrataTargets(
        ("gemma3-270m", "Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder-1.5B-Instruct"),
        2,
        any_variant=True,
        stop_variant="fides-stop",
    ),
}


def strata_command(dataset: str = "nq-swap") -> str:
    """The command that produces a backbone's strata run on `dataset`."""
    return (
        f"fides-rag eval --model MODEL --dataset {dataset}-both --methods standard,adacad,fides,fides+nwcad "
        f"--strata --per-stratum 300 --out results/eval/<backbone>-{STRATA_DATASETS[dataset]}-strata"
    )


class NoStrataResults(ValueError):
    """No backbone has strata results (or a strata run folder holds results written without --strata)."""


def load_strata(b: Backbone, root: Path = RESULTS, dataset: str = "nq-swap") -> dict | None:
    """A backbone's strata results, None when its strata run is absent; results without strata are refused."""
    run = b.strata_run(dataset)
    results = load(run, root)
    if results is None:
        return None
    if not isinstance(results.get("strata"), dict) or "results" not in results["strata"]:
        raise NoStrataResults(
            f"{root / run / 'results.json'} holds no strata results (written without "
            f"--strata or by an older fides-rag); produce them with: {strata_command(dataset)}"
        )
    return results["strata"]


def _entry(e: dict) -> dict:
    ci = e.get("ci_vs_standard")
    return {
        "n": int(e["n"]),
        "questions": e.get("questions"),
        "score": e["score"],
        "regressions": int(e["regressions"]),
        "fixes": int(e["fixes"]),
        "ci_vs_standard": None if ci is None else [float(ci[0]), float(ci[1])],
        "standard_right": int(e.get("standard_right", 0)),
        "failures": e.get("failures"),
    }


def strata_backbones(root: Path = RESULTS, dataset: str = "nq-swap") -> dict[str, dict]:
    """backbone name -> {"strata": stratum -> method -> figures, "true_conflict_available": rows, "run": its folder},
    for the backbones with strata results; NoStrataResults when none has any."""
    out = {}
    for b in BACKBONES:
        strata = load_strata(b, root, dataset)
        if strata is None:
            continue
        out[b.name] = {
            "strata": {s: {m: _entry(e) for m, e in strata["results"].get(s, {}).items()} for s in STRATA},
            "true_conflict_available": int(strata.get("available", {}).get("true_conflict", 0)),
            "scanned_all": strata.get("scanned_questions") is None
            or strata["scanned_questions"] >= strata.get("questions", 0),
            "run": root / b.strata_run(dataset),
        }
    if not out:
        runs = ", ".join(b.strata_run(dataset) for b in BACKBONES)
        raise NoStrataResults(
            f"no strata results under {root} (none of {runs} has a results.json); produce them per "
            f"backbone with: {strata_command(dataset)}"
        )
    return out


def _wins(entry: dict | None) -> bool:
    """Beats standard with the 95% CI of the difference above 0."""
    return entry is not None and entry["ci_vs_standard"] is not None and entry["ci_vs_standard"][0] > 0


def _harmless(method: dict | None, standard: dict | None) -> bool | None:
    """Known-agreeing EM >= standard's - 1 point, regressions <= 3% of the rows standard gets right; None: not run."""
    if method is None or standard is None or not method["n"] or method["score"] is None or standard["score"] is None:
        return None
    return (
        method["score"] >= standard["score"] - EM_SLACK
        and method["regressions"] <= REGRESSION_SHARE / 100 * standard["standard_right"]
    )


def recommend(backbones: dict[str, dict], dataset: str = "nq-swap") -> str:
    """The variant to recommend: the non-standard method harmless on known-agreeing rows on most backbones, then winning
    true-conflict CF on most, then with the largest mean true-conflict CF gain."""
    methods = sorted({m for b in backbones.values() for s in b["strata"].values() for m in s} - {"standard"})
    if not methods:
        raise NoStrataResults(
            f"the strata results hold no method besides standard; produce them with: {strata_command(dataset)}"
        )

    def merit(m: str) -> tuple:
        agreeing = [
            (b["strata"]["known_agreeing"].get(m), b["strata"]["known_agreeing"].get("standard"))
            for b in backbones.values()
        ]
        conflict = [
            (b["strata"]["true_conflict"].get(m), b["strata"]["true_conflict"].get("standard"))
            for b in backbones.values()
        ]
        harmless = sum(bool(_harmless(mine, std)) for mine, std in agreeing)
        wins = sum(_wins(mine) for mine, _ in conflict)
        gains = [
            mine["score"] - std["score"]
            for mine, std in conflict
            if mine is not None and std is not None and mine["score"] is not None and std["score"] is not None
        ]
        return harmless, wins, sum(gains) / len(gains) if gains else float("-inf"), m == "fides"

    return max(methods, key=merit)


JSON_FIGURES = ("n", "questions", "score", "regressions", "fixes", "ci_vs_standard", "failures")
"""The figures of each cell of --strata --json."""


def _read_counts(run: Path) -> dict | None:
    """stratum -> method -> n, questions and failures, read again from a strata run folder; None (with a note on
    stderr) when that cannot be done."""
    if not (run / "run.json").is_file():
        print(f"scale_trend.py: note: no questions or failure classes for {run}: it holds no run.json", file=sys.stderr)
        return None
    try:
        from fides_rag.eval.strata_run import read_strata_counts

        return read_strata_counts(run)
    except (ImportError, OSError, ValueError) as err:
        print(f"scale_trend.py: note: no questions or failure classes for {run}: {err}", file=sys.stderr)
        return None


def fill_counts(strata: dict, run: Path) -> None:
    """Give the cells of a backbone's strata that lack questions or failure classes those read again from its run
    folder, where the rows are the same (n agrees)."""
    if all(e["questions"] is not None and e["failures"] is not None for s in strata.values() for e in s.values()):
        return
    counts = _read_counts(run)
    if counts is None:
        return
    for stratum, methods in strata.items():
        for method, e in methods.items():
            found = counts.get(stratum, {}).get(method)
            if found is None or found["n"] != e["n"]:
                print(f"scale_trend.py: note: {run}: {stratum} {method}: other rows than the results", file=sys.stderr)
                continue
            e.update(questions=found["questions"], failures=found["failures"])


def strata_json(root: Path = RESULTS, recommended: str | None = None, dataset: str = "nq-swap") -> str:
    backbones = strata_backbones(root, dataset)
    for b in backbones.values():
        fill_counts(b["strata"], b["run"])
    figures = {
        name: {
            "strata": {s: {m: {k: e[k] for k in JSON_FIGURES} for m, e in b["strata"][s].items()} for s in STRATA},
            "true_conflict_available": b["true_conflict_available"],
        }
        for name, b in backbones.items()
    }
    return json.dumps({"recommended": recommended or recommend(backbones, dataset), "backbones": figures}, indent=2)


def _ci(e: dict | None) -> str:
    if e is None or e["ci_vs_standard"] is None:
        return "not run"
    return f"[{e['ci_vs_standard'][0]:+.1f}, {e['ci_vs_standard'][1]:+.1f}]"


STRATA_HEADLINE_METHODS = ("standard", "adacad", "fides")


def _score_cell(entry: dict | None, reference: bool) -> str:
    """A method's score in a stratum, with its regressions against standard (rows standard gets right it breaks)."""
    if entry is None or entry["score"] is None:
        return "–"
    return f"{entry['score']:.1f}" if reference else f"{entry['score']:.1f} ({entry['regressions']})"


def _headline_table(
    backbones: dict[str, dict],
    shown: list[str],
    names: dict[str, str],
    count: Callable[[dict | None], str],
    count_label: str,
) -> str:
    """One row per backbone: the true-conflict count (`count` of standard's cell) of the rows available, each shown
    method's CF, the known-agreeing count and each method's EM, with regressions; "not run" where a backbone has no
    run."""
    head = ["backbone", f"true-conflict {count_label}"] + [f"CF {names.get(m, m)}" for m in shown]
    head += [f"known-agreeing {count_label}"] + [f"EM {names.get(m, m)}" for m in shown]
    rows = []
    for b in BACKBONES:
        data = backbones.get(b.name)
        if data is None:
            rows.append([f"{b.name} ({b.size})", "not run", *["–"] * len(shown), "not run", *["–"] * len(shown)])
            continue
        tc, ka = data["strata"]["true_conflict"], data["strata"]["known_agreeing"]
        rows.append(
            [f"{b.name} ({b.size})", f"{count(tc.get('standard'))} of {data['true_conflict_available']}"]
            + [_score_cell(tc.get(m), m == "standard") for m in shown]
            + [count(ka.get("standard"))]
            + [_score_cell(ka.get(m), m == "standard") for m in shown]
        )
    return table(head, rows)


def strata_headline(root: Path = RESULTS, recommended: str | None = None, dataset: str = "nq-swap") -> str:
    """One row per backbone: true-conflict CF and known-agreeing EM of standard, AdaCAD, FIDES and the recommended
    variant, each with its regressions against standard (on BIG-bench conflicts: of the methods its runs hold)."""
    if dataset != "nq-swap":
        return strata_headline_held(root, recommended, dataset)
    backbones = strata_backbones(root, dataset)
    chosen = recommended or recommend(backbones, dataset)
    shown = [*STRATA_HEADLINE_METHODS, *([chosen] if chosen not in STRATA_HEADLINE_METHODS else [])]
    names = {"standard": "standard", "adacad": "AdaCAD", "fides": "FIDES"}

    def count(entry: dict | None) -> str:
        return str(entry.get("n", 0)) if entry is not None else "0"

    return _headline_table(backbones, shown, names, count, "n")


HELD_METHOD_ORDER = ("standard", "adacad", "fides", "fides-stop", "fides-calibrated")
"""The order of the methods in the BIG-bench headline and the failure classes; others held come after, by name."""
METHOD_NAMES = {"standard": "standard", "adacad": "AdaCAD", "fides": "FIDES"}


def _held_methods(backbones: dict[str, dict]) -> list[str]:
    """The methods the strata runs hold, those of HELD_METHOD_ORDER first in that order, the others by name."""
    held = {m for b in backbones.values() for s in b["strata"].values() for m in s}
    return [m for m in HELD_METHOD_ORDER if m in held] + sorted(held - set(HELD_METHOD_ORDER))


def _rows_questions(entry: dict | None) -> str:
    """A stratum's size: rows, and distinct questions where known, as "100 (100 q)"."""
    if entry is None:
        return "0"
    return str(entry["n"]) if entry["questions"] is None else f"{entry['n']} ({entry['questions']} q)"


def _counted_backbones(root: Path, dataset: str, raise_when_empty: bool = False) -> dict[str, dict]:
    """strata_backbones with questions and failure classes filled in, and {} (every backbone not run) where no backbone
    has a strata run yet, unless raise_when_empty; a run holding results without strata is always refused."""
    try:
        backbones = strata_backbones(root, dataset)
    except NoStrataResults:
        if raise_when_empty or any((root / b.strata_run(dataset) / "results.json").is_file() for b in BACKBONES):
            raise
        return {}
    for data in backbones.values():
        fill_counts(data["strata"], data["run"])
    return backbones


def strata_headline_held(root: Path = RESULTS, recommended: str | None = None, dataset: str = "nq-swap") -> str:
    """One row per backbone: true-conflict CF and known-agreeing EM, each stratum with its rows and distinct
    questions, of the methods HELD_METHOD_ORDER names that the runs hold and the recommended variant; "–" where a
    backbone's run lacks a method, "not run" where it has no run (every backbone, while none has one)."""
    backbones = _counted_backbones(root, dataset)
    held = _held_methods(backbones)
    shown = [m for m in held if m in HELD_METHOD_ORDER]
    if backbones:
        chosen = recommended or recommend(backbones, dataset)
        shown += [] if chosen in shown else [chosen]
    return _headline_table(backbones, shown, METHOD_NAMES, _rows_questions, "n (questions)")


def strata_failures(root: Path = RESULTS, recommended: str | None = None, dataset: str = "nq-swap") -> str:
    """Per backbone, stratum and method: rows (questions), the score, and the wrong answers by failure class
    (`fides_rag.eval.failures`); "–" where the run's cell has no classes and none could be read again."""
    del recommended  # every method held is shown
    backbones = _counted_backbones(root, dataset)
    methods = _held_methods(backbones)
    classes = ("memorised", "no_stop", "other_span", "other")
    head = ["backbone", "stratum", "method", "rows (questions)", "score", "wrong", *classes]
    rows = []
    for b in BACKBONES:
        data = backbones.get(b.name)
        if data is None:
            rows.append([f"{b.name} ({b.size})", "not run", *["–"] * (len(head) - 2)])
            continue
        first = True
        for stratum in STRATA:
            cells = data["strata"][stratum]
            for i, m in enumerate(mm for mm in methods if mm in cells):
                e = cells[m]
                failures = e["failures"]
                counts = ["–"] * (len(classes) + 1)
                if failures is not None:
                    counts = [str(sum(failures.values()))] + [str(failures.get(c, 0)) for c in classes]
                rows.append(
                    [
                        f"{b.name} ({b.size})" if first else "",
                        stratum if i == 0 else "",
                        m,
                        _rows_questions(e),
                        "–" if e["score"] is None else f"{e['score']:.1f}",
                        *counts,
                    ]
                )
                first = False
    return table(head, rows)


def _best_win(cells: dict, methods: list[str]) -> tuple[str, dict] | None:
    """Of `methods`, the one whose true-conflict CF difference from standard has the highest CI lower bound."""
    run = [(m, cells[m]) for m in methods if cells.get(m) is not None and cells[m]["ci_vs_standard"] is not None]
    return max(run, key=lambda item: item[1]["ci_vs_standard"][0], default=None)


def _no_stop(strata: dict, method: str) -> int | None:
    """A method's answers that hold a right answer and go on, over every stratum; None where not counted."""
    cells = [strata[s].get(method) for s in STRATA]
    if any(c is None or c["failures"] is None for c in cells):
        return None
    return sum(int(c["failures"].get("no_stop", 0)) for c in cells)


def _stop_cells(strata: dict, variant: str) -> tuple[str, bool | None]:
    """The stop-aware variant's no_stop answers against FIDES's, and whether they are at most STOP_SHARE of them."""
    mine, fides = _no_stop(strata, variant), _no_stop(strata, "fides")
    if mine is None or fides is None:
        return "not run", None
    return f"{mine} / {fides}", mine <= STOP_SHARE * fides


def strata_targets(root: Path = RESULTS, recommended: str | None = None, dataset: str = "nq-swap") -> str:
    """Per backbone: true-conflict rows, the winning method against standard on true-conflict CF, the recommended
    variant's harm on known-agreeing rows (and on BIG-bench conflicts the stop-aware variant's answers that do not
    stop against FIDES's); then which targets hold, over the backbones the dataset's targets count."""
    spec = STRATA_TARGETS[dataset]
    backbones = _counted_backbones(root, dataset, raise_when_empty=True)
    chosen = recommended or recommend(backbones, dataset)
    wins_head = (
        ["best method: CF − standard CI"]
        if spec.any_variant
        else ["FIDES CF − standard CI", f"{chosen} CF − standard CI"]
    )
    head = [
        "backbone",
        "true-conflict n / available",
        f"≥ {TRUE_CONFLICT_ROWS} or all",
        *wins_head,
        "CF beaten",
        f"{chosen} known-agreeing EM / standard, regressions / standard right",
        "harmless",
    ]
    if spec.stop_variant:
        head += [f"no_stop {spec.stop_variant} / FIDES", f"≤ {STOP_SHARE} of FIDES's"]
    rows, enough, beaten, harmless, stops = [], 0, 0, 0, 0
    for b in BACKBONES:
        data = backbones.get(b.name)
        counted = b.name in spec.backbones
        label = f"{b.name} ({b.size})" + ("" if counted else " (not counted)")
        if data is None:
            rows.append([label, "not run", *["–"] * (len(head) - 2)])
            continue
        tc, ka = data["strata"]["true_conflict"], data["strata"]["known_agreeing"]
        n = tc.get("standard", {}).get("n", 0)
        ok_n = n >= TRUE_CONFLICT_ROWS or (data["scanned_all"] and n == data["true_conflict_available"])
        if spec.any_variant:
            best = _best_win(tc, [m for m in tc if m != "standard"])
            won = best is not None and _wins(best[1])
            wins = ["not run" if best is None else f"{best[0]} {_ci(best[1])}"]
        else:
            won = _wins(tc.get("fides")) or _wins(tc.get(chosen))
            wins = [_ci(tc.get("fides")), _ci(tc.get(chosen))]
        safe = _harmless(ka.get(chosen), ka.get("standard"))
        mine, std = ka.get(chosen), ka.get("standard")
        agreeing = (
            "not run"
            if safe is None
            else f"{mine['score']:.1f} / {std['score']:.1f}, {mine['regressions']} / {std['standard_right']}"
        )
        row = [label, f"{n} / {data['true_conflict_available']}", "yes" if ok_n else "no", *wins]
        row += ["yes" if won else "no", agreeing, "not run" if safe is None else "yes" if safe else "no"]
        stop_held = None
        if spec.stop_variant:
            figure, stop_held = _stop_cells(data["strata"], spec.stop_variant)
            row += [figure, "not run" if stop_held is None else "yes" if stop_held else "no"]
        rows.append(row)
        if counted:
            enough += ok_n
            beaten += won
            harmless += bool(safe)
            stops += bool(stop_held)
    total = len(spec.backbones)
    winner = "a method" if spec.any_variant else f"FIDES or {chosen}"
    verdicts = [
        (
            f"- true-conflict rows ≥ {TRUE_CONFLICT_ROWS} (or all available) on every backbone: "
            f"{'held' if enough == total else 'not held'} ({enough} of {total})"
        ),
        (
            f"- {winner} beats standard on true-conflict CF with the CI above 0 on ≥ {spec.wins_needed} of "
            f"{total} backbones: {'held' if beaten >= spec.wins_needed else 'not held'} ({beaten})"
        ),
    ]
    if spec.stop_variant:
        verdicts.append(
            f"- {spec.stop_variant}'s answers that do not stop at most {STOP_SHARE} of FIDES's, on every backbone: "
            f"{'held' if stops == total else 'not held'} ({stops} of {total})"
        )
    verdicts.append(
        f"- {chosen} on known-agreeing rows: EM ≥ standard − {EM_SLACK:g} and regressions ≤ {REGRESSION_SHARE:g}% of "
        f"the rows standard gets right, on every backbone: {'held' if harmless == total else 'not held'} "
        f"({harmless} of {total})"
    )
    return "\n".join([f"Recommended variant: {chosen}", "", table(head, rows), "", *verdicts])


def write_block(path: Path, marker: str, text: str) -> None:
    """Replace what lies between the lines `<!-- marker -->` and `<!-- /marker -->` of `path` with `text`."""
    start, end = f"<!-- {marker} -->\n", f"<!-- /{marker} -->"
    content = path.read_text()
    if content.count(start) != 1 or content.count(end) != 1 or content.index(start) > content.index(end):
        raise SystemExit(f"scale_trend.py: error: {path} has no single block {start.strip()} ... {end}")
    before, rest = content.split(start)
    path.write_text(before + start + text.rstrip("\n") + "\n" + end + rest.split(end, 1)[1])


def _printer(into: Path | None, marker: str | None) -> Callable[[str], None]:
    """print, or a function writing its text into the block `marker` of `into`."""
    if into is None or marker is None:
        return print
    return lambda text: write_block(into, marker, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--gates",
        action="store_true",
        help="each method against standard and AdaCAD with CIs, and its contrasted share",
    )
    modes.add_argument("--full", action="store_true", help="every method's CF, Acc and MemR, and the no-conflict slice")
    modes.add_argument(
        "--targets",
        action="store_true",
        help="the do-no-harm targets of gated FIDES (with --strata: the true-conflict targets)",
    )
    modes.add_argument("--json", action="store_true", help="with --strata: the strata figures as one JSON object")
    modes.add_argument(
        "--headline",
        action="store_true",
        help="with --strata: the README's table (true-conflict CF, known-agreeing EM, regressions)",
    )
    modes.add_argument(
        "--failures",
        action="store_true",
        help="with --strata: the wrong answers by failure class, per backbone, stratum and method",
    )
    parser.add_argument(
        "--strata", action="store_true", help="read each backbone's strata run (fides-rag eval --strata)"
    )
    parser.add_argument(
        "--recommended", help="with --strata: the variant to recommend (default: chosen from the results)"
    )
    parser.add_argument(
        "--dataset",
        choices=list(STRATA_DATASETS),
        default="nq-swap",
        help="with --strata: the dataset of the strata runs (default nq-swap)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder holding the eval runs")
    parser.add_argument(
        "--into",
        type=Path,
        metavar="FILE",
        help="write the table into FILE between <!-- MARKER --> and <!-- /MARKER --> instead of printing it",
    )
    parser.add_argument("--marker", help="with --into: the name of the block to replace")
    args = parser.parse_args()
    if (args.into is None) != (args.marker is None):
        parser.error("--into and --marker go together")
    emit = _printer(args.into, args.marker)
    if args.strata:
        if args.gates or args.full:
            parser.error("--strata takes --json, --targets, --headline or --failures")
        try:
            shown_strata = (
                strata_targets
                if args.targets
                else strata_headline
                if args.headline
                else strata_failures
                if args.failures
                else strata_json
            )
            emit(shown_strata(args.results, args.recommended, args.dataset))
        except NoStrataResults as err:
            print(f"scale_trend.py: error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        return
    if args.json or args.recommended or args.headline or args.failures or args.dataset != "nq-swap":
        parser.error("--json, --headline, --failures, --recommended and --dataset need --strata")
    shown = full if args.full else targets if args.targets else gates if args.gates else headline
    emit(shown(args.results))


if __name__ == "__main__":
    main()
