"""`fides-rag eval --strata` end to end: the closed-book lane, the strata, the seeded row selection, then the methods
on the selected rows (`run_eval`), with the strata results added to results.json and results.md.

Settings recorded in run.json under "strata" (a resume must match them): the row-selection seed, rows per stratum,
how a closed-book answer is matched, and the closed-book cache file. `read_strata_rows` reads a finished run folder
again, with no model (its scored rows and their strata), and `read_strata_counts` counts the rows, questions and
failure classes of each stratum and method from them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fides_rag.eval.closed_book import (
    CLOSED_BOOK,
    DEFAULT_IN_FLIGHT,
    answered_questions,
    closed_book_answers,
    closed_book_settings,
    distinct_questions,
    extend_prefix,
)
from fides_rag.eval.datasets import QAExample, dataset_files, load_examples
from fides_rag.eval.harness import RESULTS_MD, run_eval, write_results
from fides_rag.eval.records import read_predictions
from fides_rag.eval.store import PREDICTIONS, RUN_INFO, files_sha256
from fides_rag.eval.strata import (
    KNOWN_BY,
    REFERENCE,
    STRATA_KEY,
    PerStratum,
    StrataScan,
    assign_strata,
    check_original_answers,
    check_strata_folder,
    count_strata,
    count_strata_questions,
    select_rows,
    strata_counts,
    strata_markdown,
    summarize_strata,
)
from fides_rag.rules import ContrastRule

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder


SCAN_PREFIX = "seeded shuffle, until every stratum has its rows"
SCAN_ALL = "every question"


def strata_settings(per_stratum: PerStratum, seed: int) -> dict[str, Any]:
    """The run.json entry of a strata run ("scan": how the closed-book lane chose its questions)."""
    scan = SCAN_PREFIX if StrataScan([], per_stratum).stops_early else SCAN_ALL
    return {"seed": seed, "per_stratum": per_stratum, "known_by": KNOWN_BY, "closed_book": CLOSED_BOOK, "scan": scan}


def unnamed_dataset(questions: Sequence[str]) -> str:
    """The name a closed-book cache records for examples given without a dataset name: their questions' digest."""
    digest = hashlib.sha256("\0".join(questions).encode()).hexdigest()[:16]
    return f"unnamed ({len(questions)} questions, sha256 {digest})"


def check_strata_run(
    examples: Sequence[QAExample], labels: Sequence[str], out_dir: str | Path, *, world: int = 1
) -> None:
    """What a strata run checks before a model loads: original answers on every row, standard among the methods, one
    process, and a run folder that holds no answers of a run without strata."""
    check_original_answers(examples)
    if REFERENCE not in labels:
        raise ValueError(f"--strata compares every method with {REFERENCE!r}: add {REFERENCE} to --methods")
    if world > 1:
        raise ValueError(
            f"--strata runs in one process ({world} were launched): its closed-book lane writes one cache file"
        )
    check_strata_folder(out_dir)


def run_strata_eval(
    decoder: FidesDecoder,
    examples: Sequence[QAExample],
    methods: Mapping[str, str | ContrastRule],
    out_dir: str | Path,
    *,
    model: str,
    dataset: str | None = None,
    per_stratum: PerStratum = None,
    seed: int = 0,
    batch_size: int = 8,
    max_new_tokens: int = 32,
    closed_book_in_flight: int = DEFAULT_IN_FLIGHT,
    run_info: Mapping[str, Any] | None = None,
    progress: bool = True,
    bootstrap_samples: int = 1000,
    bootstrap_by: str = "question",
) -> dict[str, Any]:
    """Answer the distinct questions closed-book (cached in the run folder), split the rows into strata, keep the
    first `per_stratum` rows of each (one count, or a count per stratum) in a shuffle seeded with `seed`, decode them
    under every method and write the results with their strata ("strata" in results.json: settings, rows and
    questions available and scored, per-stratum results with each method's failure classes).

    With a count for every stratum, the lane scans the questions in a shuffle seeded with `seed` and stops at the
    first question by which every stratum has its rows (or at the end of the set); otherwise it answers them all.
    `dataset` (default: run_info's, else `unnamed_dataset`) is recorded in the closed-book cache, which refuses
    answers of another dataset, model or prompt."""
    out = Path(out_dir)
    check_strata_run(examples, list(methods), out)
    questions = distinct_questions(e.question for e in examples)
    dataset = dataset or str((run_info or {}).get("dataset") or "") or unnamed_dataset(questions)
    lane_settings = closed_book_settings(decoder, model=model, dataset=dataset, max_new_tokens=max_new_tokens)
    scan = StrataScan(examples, per_stratum)
    order = scan.order(questions, seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(order), unit="q", dynamic_ncols=True, desc="closed-book")
    try:
        answers = closed_book_answers(
            decoder,
            order,
            out / CLOSED_BOOK,
            settings=lane_settings,
            in_flight=closed_book_in_flight,
            on_answer=bar.update if bar is not None else None,
            enough=scan.add if scan.stops_early else None,
        )
    finally:
        if bar is not None:
            bar.close()
    examples = [e for e in examples if e.question in answers]
    strata = assign_strata(examples, answers)
    chosen = select_rows(examples, strata, per_stratum, seed)
    settings = strata_settings(per_stratum, seed)
    info = {**dict(run_info or {}), STRATA_KEY: settings}
    results = run_eval(
        decoder,
        chosen,
        methods,
        out,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        run_info=info,
        progress=progress,
        bootstrap_samples=bootstrap_samples,
        bootstrap_by=bootstrap_by,
        seed=seed,
    )
    ids = {e.id for e in chosen}
    records = [r for r in read_predictions(out / PREDICTIONS) if r["id"] in ids]
    results[STRATA_KEY] = {
        **settings,
        "questions": len(questions),
        "scanned_questions": len(answers),
        "available": count_strata(strata),
        "available_questions": count_strata_questions(examples, strata),
        "scored": count_strata({i: s for i, s in strata.items() if i in ids}),
        "scored_questions": count_strata_questions(chosen, strata),
        "results": summarize_strata(
            records,
            strata,
            list(methods),
            samples=bootstrap_samples,
            seed=seed,
            bootstrap_by=bootstrap_by,
            examples=chosen,
        ),
    }
    write_results(out, results)
    with (out / RESULTS_MD).open("a", encoding="utf-8") as handle:
        handle.write("\n" + strata_markdown(results[STRATA_KEY]))
    return results


def _run_examples(out: Path, info: Mapping[str, Any]) -> list[QAExample]:
    """The examples a run folder's answers were decoded from: its dataset, refused unless its files are unchanged."""
    files = dataset_files(info["dataset"], info.get("data"))
    if not files or files_sha256(files) != info.get("data_sha256"):
        raise ValueError(
            f"the data of {out} ({info['dataset']}, files {info.get('data_files')}) is not here as the run read it; "
            "its rows cannot be read again"
        )
    return load_examples(info["dataset"], info.get("data"))


@dataclass(frozen=True)
class StrataRows:
    """A finished strata run's scored rows, read again from its folder: the records of the chosen rows, each row's
    stratum, the method labels, and the chosen rows' examples (their answers and passages)."""

    records: list[dict[str, Any]]
    strata: dict[str, str]
    labels: list[str]
    examples: list[QAExample]


def read_strata_counts(out_dir: str | Path) -> dict[str, dict[str, dict[str, Any]]]:
    """stratum -> method -> n, questions and failures of a finished strata run, read again from its folder (run.json,
    closed_book.jsonl, predictions.jsonl) and its dataset, with no model: for results written before they counted
    questions and failure classes. A ValueError names what is missing or changed."""
    rows = read_strata_rows(out_dir)
    return strata_counts(rows.records, rows.strata, rows.labels, rows.examples)


def read_strata_rows(out_dir: str | Path) -> StrataRows:
    """A finished strata run's scored rows (`StrataRows`), with no model; a ValueError names what is missing."""
    out = Path(out_dir)
    if not (out / RUN_INFO).is_file():
        raise ValueError(f"{out} holds no {RUN_INFO}: not a run folder")
    info = json.loads((out / RUN_INFO).read_text(encoding="utf-8"))
    settings = info.get(STRATA_KEY)
    if not isinstance(settings, Mapping):
        raise ValueError(f"{out / RUN_INFO} has no '{STRATA_KEY}' settings: not a strata run")
    examples = _run_examples(out, info)
    questions = distinct_questions(e.question for e in examples)
    lane_settings = {"model": info["model"], "max_new_tokens": info["max_new_tokens"]}
    answered = answered_questions(out / settings["closed_book"], questions, lane_settings)
    if settings.get("scan") == SCAN_PREFIX:  # runs before the scan answered every question
        scan = StrataScan(examples, settings["per_stratum"])
        prefix: dict[str, str] = {}
        extend_prefix(prefix, scan.order(questions, settings["seed"]), answered, scan.add)
        answered = prefix
    examples = [e for e in examples if e.question in answered]
    strata = assign_strata(examples, answered)
    chosen = select_rows(examples, strata, settings["per_stratum"], settings["seed"])
    ids = {e.id for e in chosen}
    records = [r for r in read_predictions(out / PREDICTIONS) if r["id"] in ids]
    return StrataRows(records, strata, list(info["methods"]), chosen)
