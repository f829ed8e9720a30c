"""Strata of `fides-rag eval --strata`: every row split by its passage (swapped or original) and by whether the model
knew the question's original answer closed-book, with each method scored against standard inside each stratum.

- true_conflict: a swapped passage, and the model knew the original answer closed-book (a real conflict);
- supplied: a swapped passage the model did not know (the passage only supplies an answer);
- known_agreeing: the original passage, and the model knew the answer;
- unknown_agreeing: the original passage, and the model did not know it.

The model "knew" a row when its closed-book answer contains one of the row's original answers with at most 3 extra
words (`metrics.containment`, which every exact match meets). A stratum is scored with CF on the conflict strata and
EM on the agreeing ones; regressions are rows standard gets right that a method gets wrong, fixes the reverse. Each
stratum counts its rows (`n`) and their distinct questions, and each method's wrong answers by failure class
(`fides_rag.eval.failures`: memorised, no_stop, other_span, other).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fides_rag.eval.datasets import QAExample
from fides_rag.eval.failures import FAILURE_CLASSES, answer_class, count_failures
from fides_rag.eval.harness import share_contrasted
from fides_rag.eval.metrics import containment
from fides_rag.eval.significance import paired_bootstrap
from fides_rag.eval.store import PREDICTIONS, RUN_INFO
from fides_rag.eval.tables import markdown_table

STRATA = ("true_conflict", "supplied", "known_agreeing", "unknown_agreeing")
CONFLICT_STRATA = ("true_conflict", "supplied")
STRATA_KEY = "strata"
"""The key of the strata settings in run.json and of the strata results in results.json."""
REFERENCE = "standard"
KNOWN_BY = "containment"
"""How a closed-book answer is matched with the original answers (recorded in run.json)."""


def score_metric(stratum: str) -> str:
    """The metric a stratum is scored with: CF on the conflict strata, EM on the agreeing ones."""
    if stratum not in STRATA:
        raise ValueError(f"unknown stratum {stratum!r}; the strata are {', '.join(STRATA)}")
    return "cf" if stratum in CONFLICT_STRATA else "em"


def check_original_answers(examples: Sequence[QAExample]) -> None:
    """A ValueError naming the fields when some example lacks its original answer (strata need it on every row)."""
    missing = [e.id for e in examples if not e.original_answers]
    if missing:
        raise ValueError(
            f"--strata needs each row's original answer (what the model may know closed-book), and {len(missing)} of "
            f"{len(examples)} rows have none (first: {missing[0]!r}); NQ-Swap and BIG-bench conflicts carry it "
            "(org_answer); in a jsonl give `memory_answers` on rows with a swapped passage and `original_answers` on "
            "rows whose passage agrees"
        )


def knew(closed_book_answer: str, original_answers: Sequence[str]) -> bool:
    """Whether a closed-book answer gives one of the original answers (containment: at most 3 extra words)."""
    return bool(containment(closed_book_answer, original_answers))


def stratum_of(example: QAExample, closed_book_answer: str) -> str:
    """The stratum of one row from its passage (swapped: it has memory answers) and its closed-book answer."""
    known = knew(closed_book_answer, example.original_answers)
    if example.is_conflict:
        return "true_conflict" if known else "supplied"
    return "known_agreeing" if known else "unknown_agreeing"


def assign_strata(examples: Sequence[QAExample], closed_book: Mapping[str, str]) -> dict[str, str]:
    """example id -> stratum, from `closed_book` (question -> closed-book answer)."""
    check_original_answers(examples)
    absent = [e.question for e in examples if e.question not in closed_book]
    if absent:
        raise ValueError(
            f"no closed-book answer for {len(absent)} questions (first: {absent[0]!r}); run the closed-book lane first"
        )
    return {e.id: stratum_of(e, closed_book[e.question]) for e in examples}


def count_strata(strata: Mapping[str, str]) -> dict[str, int]:
    """stratum -> rows, for every stratum (0 where none)."""
    return {s: sum(1 for v in strata.values() if v == s) for s in STRATA}


def count_strata_questions(examples: Sequence[QAExample], strata: Mapping[str, str]) -> dict[str, int]:
    """stratum -> distinct questions among the rows of `examples` in it, for every stratum (0 where none)."""
    return {s: len({e.question for e in examples if strata.get(e.id) == s}) for s in STRATA}


PerStratum = int | Mapping[str, int | None] | None
"""Rows to score per stratum: one count for every stratum, a count per stratum (None: every row), or None (all)."""


def parse_per_stratum(text: str) -> int | dict[str, int | None]:
    """`--per-stratum`'s value: `N` (every stratum), or comma-separated `STRATUM=N` entries with at most one bare `N`
    for the strata not named (without it they keep every row), e.g. `50,true_conflict=300,known_agreeing=300`."""
    default: int | None = None
    named: dict[str, int | None] = {}
    entries = [entry.strip() for entry in text.split(",")]
    for entry in entries:
        name, _, count = entry.rpartition("=")
        if name and name not in STRATA:
            raise ValueError(f"unknown stratum {name!r} in --per-stratum {text!r}; strata: {', '.join(STRATA)}")
        if name in named or (not name and default is not None):
            raise ValueError(f"--per-stratum {text!r} sets {name or 'the default count'} twice")
        try:
            number = int(count)
        except ValueError:
            raise ValueError(f"expected N or STRATUM=N in --per-stratum, got {entry!r}") from None
        if number < 1:
            raise ValueError(f"--per-stratum counts must be >= 1, got {entry!r}")
        if name:
            named[name] = number
        else:
            default = number
    if not named:
        assert default is not None  # one entry, a bare count
        return default
    return {s: named.get(s, default) for s in STRATA}


def _quotas(per_stratum: PerStratum) -> dict[str, int | None]:
    if per_stratum is None or isinstance(per_stratum, int):
        quotas: dict[str, int | None] = dict.fromkeys(STRATA, per_stratum)
    else:
        unknown = sorted(set(per_stratum) - set(STRATA))
        if unknown:
            raise ValueError(f"per_stratum names unknown strata {unknown}; strata: {', '.join(STRATA)}")
        quotas = {s: per_stratum.get(s) for s in STRATA}
    for stratum, quota in quotas.items():
        if quota is not None and quota < 1:
            raise ValueError(f"per_stratum must be >= 1 (or None for every row), got {quota} for {stratum}")
    return quotas


def select_rows(
    examples: Sequence[QAExample], strata: Mapping[str, str], per_stratum: PerStratum, seed: int
) -> list[QAExample]:
    """The first `per_stratum` rows of each stratum (a count for all, or one per stratum, None meaning every row) in a
    fixed shuffle of `examples` (random.Random(seed)), in shuffle order; every row when per_stratum is None. Chosen
    from the closed-book lane alone, before any method is scored, so every method runs on the same rows."""
    quotas = _quotas(per_stratum)
    if all(quota is None for quota in quotas.values()):
        return list(examples)
    order = list(examples)
    random.Random(seed).shuffle(order)
    taken = dict.fromkeys(STRATA, 0)
    chosen = []
    for example in order:
        stratum = strata[example.id]
        quota = quotas[stratum]
        if quota is None or taken[stratum] < quota:
            taken[stratum] += 1
            chosen.append(example)
    return chosen


class StrataScan:
    """The closed-book lane's stopping point: with a row count for every stratum, it scans the questions in a seeded
    shuffle and stops at the first question by which every stratum holds its count of rows (`add`); with any
    stratum left at every row it scans them all. The scanned questions are a prefix of that shuffle, so a resumed or
    repeated scan stops at the same question whatever order the answers arrived in."""

    def __init__(self, examples: Sequence[QAExample], per_stratum: PerStratum) -> None:
        self.quotas = _quotas(per_stratum)
        self.stops_early = all(quota is not None for quota in self.quotas.values())
        self._rows: dict[str, list[QAExample]] = {}
        for example in examples:
            self._rows.setdefault(example.question, []).append(example)
        self.found = dict.fromkeys(STRATA, 0)
        """stratum -> rows among the questions scanned so far."""

    def order(self, questions: Sequence[str], seed: int) -> list[str]:
        """The order the lane answers `questions` in: a shuffle seeded with `seed` when the scan may stop early."""
        order = list(questions)
        if self.stops_early:
            random.Random(seed).shuffle(order)
        return order

    def add(self, question: str, closed_book_answer: str) -> bool:
        """Counts the rows of one more scanned question; True once every stratum holds its quota."""
        for example in self._rows.get(question, ()):
            self.found[stratum_of(example, closed_book_answer)] += 1
        return self.stops_early and all(self.found[s] >= (q or 0) for s, q in self.quotas.items())


def describe_per_stratum(per_stratum: PerStratum) -> str:
    """How many rows of each stratum were scored, in words (results.md)."""
    if per_stratum is None:
        return "every row"
    if isinstance(per_stratum, int):
        return f"the first {per_stratum} of each"
    return "the first " + ", ".join(f"{'all' if per_stratum.get(s) is None else per_stratum[s]} of {s}" for s in STRATA)


def check_strata_folder(out_dir: str | Path) -> None:
    """Refuse a run folder holding answers of a run without strata (no closed-book lane): --strata never mixes them."""
    out = Path(out_dir)
    predictions, info = out / PREDICTIONS, out / RUN_INFO
    if not (predictions.is_file() and predictions.stat().st_size):
        return
    recorded = json.loads(info.read_text(encoding="utf-8")) if info.is_file() else {}
    if STRATA_KEY not in recorded:
        raise ValueError(
            f"{out} holds answers of a run without strata (its run.json has no '{STRATA_KEY}' key: no closed-book lane "
            f"chose or split its rows), so --strata cannot add to it; use a new --out folder, or delete {predictions} "
            "to start over"
        )


def check_strata_results(results: Mapping[str, Any], where: str = "results.json") -> Mapping[str, Any]:
    """The strata results of a results.json; a ValueError when it was written without them."""
    strata = results.get(STRATA_KEY)
    if not isinstance(strata, Mapping) or "results" not in strata:
        raise ValueError(
            f"{where} holds no strata results (written without --strata or by an older fides-rag); "
            "rerun it with fides-rag eval --strata into a new --out folder"
        )
    return strata


def _score(record: Mapping[str, Any], label: str, metric: str) -> float:
    value = record["outputs"][label]["scores"].get(metric)
    if value is None:
        raise ValueError(
            f"row {record['id']!r} has no {metric} score for {label!r}: its stratum needs one "
            "(a swapped-passage row is scored with CF, an original-passage row with EM)"
        )
    return float(value)


Rows = list[Mapping[str, Any]]


def paired_rows(
    records: Sequence[Mapping[str, Any]], strata: Mapping[str, str], labels: Sequence[str]
) -> dict[str, dict[str, Rows]]:
    """stratum -> method -> its records that hold both that method's answer and standard's, sorted by id."""
    out: dict[str, dict[str, Rows]] = {}
    for stratum in STRATA:
        rows = sorted((r for r in records if strata.get(r["id"]) == stratum), key=lambda r: r["id"])
        out[stratum] = {
            label: [r for r in rows if label in r["outputs"] and REFERENCE in r["outputs"]] for label in labels
        }
    return out


def failure_counts(rows: Rows, label: str, examples: Mapping[str, QAExample]) -> dict[str, int]:
    """failure class -> how many of `label`'s answers on `rows` fall in it, each classified against its example (id ->
    example: the answers expected, the memory answers, the passages the model saw)."""
    classes = []
    for r in rows:
        example = examples[r["id"]]
        text = r["outputs"][label]["text"]
        classes.append(answer_class(text, example.context_answers, example.memory_answers, example.contexts))
    return count_failures(classes)


def row_counts(
    rows: Rows, label: str, examples: Mapping[str, QAExample] | None
) -> dict[str, int | dict[str, int] | None]:
    """n (rows), questions (distinct) and failures (class -> rows; None without `examples`) of one method's rows."""
    return {
        "n": len(rows),
        "questions": len({r["question"] for r in rows}),
        "failures": None if examples is None else failure_counts(rows, label, examples),
    }


def strata_counts(
    records: Sequence[Mapping[str, Any]],
    strata: Mapping[str, str],
    labels: Sequence[str],
    examples: Sequence[QAExample],
) -> dict[str, dict[str, dict[str, Any]]]:
    """stratum -> method -> n, questions and failures (`row_counts`), with no statistics: what a finished run's
    results gain when read again."""
    by_id = {e.id: e for e in examples}
    return {
        stratum: {label: row_counts(rows, label, by_id) for label, rows in methods.items()}
        for stratum, methods in paired_rows(records, strata, labels).items()
    }


def summarize_strata(
    records: Sequence[Mapping[str, Any]],
    strata: Mapping[str, str],
    labels: Sequence[str],
    *,
    samples: int = 1000,
    seed: int = 0,
    bootstrap_by: str = "question",
    examples: Sequence[QAExample] | None = None,
) -> dict[str, dict[str, dict[str, Any]]]:
    """stratum -> method -> n, questions (distinct), score (CF or EM, %), containment (%), regressions and fixes
    against standard (rows and % of n), share_contrasted (%), the paired-bootstrap difference against standard with
    its 95% CI, and failures: its wrong answers by class (`fides_rag.eval.failures`), None unless `examples` (the
    rows' examples: their passages) are given."""
    if REFERENCE not in labels:
        raise ValueError(f"strata compare every method with {REFERENCE!r}: add it to the methods")
    by_id = None if examples is None else {e.id: e for e in examples}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for stratum, methods in paired_rows(records, strata, labels).items():
        metric = score_metric(stratum)
        out[stratum] = {}
        for label, both in methods.items():
            mine = [_score(r, label, metric) for r in both]
            base = [_score(r, REFERENCE, metric) for r in both]
            contained = [r["outputs"][label]["scores"].get("containment") for r in both]
            n = len(both)
            regressions = sum(1 for a, b in zip(mine, base) if b and not a)
            fixes = sum(1 for a, b in zip(mine, base) if a and not b)
            entry: dict[str, Any] = {
                **row_counts(both, label, by_id),
                "metric": metric,
                "score": 100 * sum(mine) / n if n else None,
                "containment": 100 * sum(c for c in contained if c is not None) / n
                if n and None not in contained
                else None,
                "standard_right": int(sum(base)),
                "regressions": regressions,
                "fixes": fixes,
                "regressions_pct": 100 * regressions / n if n else None,
                "fixes_pct": 100 * fixes / n if n else None,
                "share_contrasted": share_contrasted([r["outputs"][label] for r in both]),
                "diff_vs_standard": None,
                "ci_vs_standard": None,
                "p_value": None,
            }
            if label != REFERENCE and n:
                clusters = [r["question"] for r in both] if bootstrap_by == "question" else None
                test = paired_bootstrap(
                    [100 * x for x in mine], [100 * x for x in base], samples=samples, seed=seed, clusters=clusters
                )
                entry.update(
                    diff_vs_standard=test["diff"],
                    ci_vs_standard=[test["ci_low"], test["ci_high"]],
                    p_value=test["p_value"],
                )
            out[stratum][label] = entry
    return out


def _cell(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def missing_answers(strata: Mapping[str, Any]) -> list[str]:
    """Where a method answered fewer rows than were scored ("fides: 3 of 5 true_conflict rows"); empty for a whole
    run (and for results that do not say how many rows were scored)."""
    scored = strata.get("scored") or {}
    return [
        f"{label}: {e['n']} of {scored[stratum]} {stratum} rows"
        for stratum in STRATA
        if stratum in scored
        for label, e in strata["results"].get(stratum, {}).items()
        if e["n"] < scored[stratum]
    ]


def _questions(count: int) -> str:
    return f"{count} question" if count == 1 else f"{count} questions"


def _per_stratum_counts(strata: Mapping[str, Any], rows: str, questions: str) -> str:
    counts, distinct = strata.get(rows, {}), strata.get(questions)
    return ", ".join(
        f"{s} {counts.get(s, 0)}" + ("" if distinct is None else f" ({_questions(distinct.get(s, 0))})") for s in STRATA
    )


def _strata_header(strata: Mapping[str, Any]) -> str:
    scored = (
        f"; scored: {describe_per_stratum(strata['per_stratum'])} in a shuffle with seed {strata['seed']}"
        if strata.get("per_stratum")
        else ""
    )
    scanned = strata.get("scanned_questions")
    lane = "each distinct question answered without documents"
    if scanned is not None and scanned < strata["questions"]:
        lane = (
            f"{scanned} of the {strata['questions']} distinct questions answered without documents, in a shuffle "
            f"with seed {strata['seed']}, stopping once every stratum had its rows"
        )
    return (
        f"Strata (closed-book lane: {lane}; rows available per stratum: "
        f"{_per_stratum_counts(strata, 'available', 'available_questions')}{scored}). Score = CF on the conflict "
        "strata, EM on the agreeing ones; n = rows, questions = the distinct questions among them; regressions and "
        "fixes against standard (rows, % of n); CI = paired bootstrap 95% CI of the difference against standard, in "
        "points."
    )


def _scores_table(strata: Mapping[str, Any]) -> str:
    head = ["stratum", "method", "n", "questions", "score", "Cont", "regressions", "fixes", "contrasted %"]
    rows = []
    for stratum in STRATA:
        for label, e in strata["results"].get(stratum, {}).items():
            ci = e.get("ci_vs_standard")
            rows.append(
                [
                    stratum,
                    label,
                    str(e["n"]),
                    _cell(e.get("questions")),
                    f"{e['metric'].upper()} {_cell(e['score'])}",
                    _cell(e.get("containment")),
                    f"{e['regressions']} ({_cell(e['regressions_pct'])}%)",
                    f"{e['fixes']} ({_cell(e['fixes_pct'])}%)",
                    _cell(e.get("share_contrasted")),
                    "" if ci is None else f"{e['diff_vs_standard']:+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}]",
                ]
            )
    return markdown_table([*head, "− standard [95% CI]"], rows)


def _failures_table(strata: Mapping[str, Any]) -> str | None:
    """Each method's wrong answers by class per stratum; None when the results hold no failure classes."""
    head = ["stratum", "method", "n", "right", "failures", *(c.replace("_", " ") for c in FAILURE_CLASSES)]
    rows = []
    for stratum in STRATA:
        for label, e in strata["results"].get(stratum, {}).items():
            failures = e.get("failures")
            if failures is None:
                continue
            wrong = sum(failures.values())
            rows.append(
                [stratum, label, str(e["n"]), str(e["n"] - wrong), str(wrong)]
                + [str(failures[c]) for c in FAILURE_CLASSES]
            )
    return markdown_table(head, rows) if rows else None


def strata_markdown(strata: Mapping[str, Any]) -> str:
    """The strata section of results.md: per stratum and method, rows and questions, score, regressions, fixes and
    CI against standard, then the wrong answers by failure class; a run that lacks answers says it is partial."""
    lines = []
    missing = missing_answers(strata)
    if missing:
        lines += [
            "**Partial run**: these figures cover only the rows answered so far, not the whole run ("
            + "; ".join(missing)
            + "). Rerun the same command to finish it.",
            "",
        ]
    lines += [_strata_header(strata), "", _scores_table(strata)]
    failures = _failures_table(strata)
    if failures is not None:
        lines += [
            "",
            "Wrong answers by class, each in the first that applies: memorised = the original answer the passage "
            "contradicts; no stop = holds a right answer but goes on; other span = another span of the passage; "
            "other = the rest. Standard's memorised count, beside its failures, is the most any contrast against "
            "memory can fix in that stratum.",
            "",
            failures,
        ]
    return "\n".join(lines) + "\n"
