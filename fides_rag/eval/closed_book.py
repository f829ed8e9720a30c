"""The closed-book lane of `fides-rag eval --strata`: each distinct question answered without documents, cached.

The answer is the decoder's own no-context path (`method="standard"` with no documents: the template's no-context
instruction, greedy), so it is what the model says from memory. A closed-book answer depends on the question alone,
so each distinct question is decoded once. Answers are appended to a JSONL cache, one line per question:
`{"key", "model", "max_new_tokens", "question", "answer"}`, with `key` = SHA-256 of the model id and the question
text. An interrupted lane resumes (the questions already in the file are kept, a half-written last line is cut);
lines of another model or another max_new_tokens are left in the file and not used.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

CLOSED_BOOK = "closed_book.jsonl"
"""The cache file of the closed-book answers, in the run folder."""
_NO_DOCUMENTS_NOTE = "no documents were given"


def question_key(model: str, question: str) -> str:
    """The cache key of one closed-book answer: SHA-256 over the model id and the question text."""
    return hashlib.sha256(f"{model}\0{question}".encode()).hexdigest()


def distinct_questions(questions: Iterable[str]) -> list[str]:
    """The questions in first-seen order, each once."""
    return list(dict.fromkeys(questions))


def read_closed_book(path: str | Path, model: str, max_new_tokens: int, repair: bool = False) -> dict[str, str]:
    """key -> answer for the lines of `path` decoded by `model` with `max_new_tokens` (none when there is no file).

    A line that is not valid JSON can only be the half-written last line of an interrupted lane: it is skipped, and
    with repair=True cut from the file. A bad line anywhere else is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        return {}
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    answers: dict[str, str] = {}
    keep = offset = 0
    for number, line in enumerate(lines, start=1):
        offset_next = offset + len(line) + 1
        if line.strip():
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or not {"key", "model", "answer"} <= set(record):
                    raise ValueError("not a closed-book record (needs key, model, answer)")
            except ValueError as err:
                if any(rest.strip() for rest in lines[number:]):
                    raise ValueError(f"{path}, line {number}: not a valid closed-book record ({err})") from None
                break
            if record["model"] == model and record.get("max_new_tokens") == max_new_tokens:
                answers[record["key"]] = record["answer"]
            keep = offset_next
        offset = offset_next
    if repair:
        if keep > len(raw):
            with path.open("ab") as handle:
                handle.write(b"\n")
        elif raw[keep:].strip():
            with path.open("r+b") as handle:
                handle.truncate(keep)
    return answers


class _DropNoDocumentsNote(logging.Filter):
    """The lane decodes without documents on purpose: the decoder's warning about it would repeat per question."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_NO_DOCUMENTS_NOTE)


def closed_book_answers(
    decoder: FidesDecoder,
    questions: Sequence[str],
    path: str | Path,
    *,
    model: str,
    max_new_tokens: int = 32,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """question -> the model's closed-book answer, for every distinct question of `questions`.

    Questions already answered in the cache `path` (same model id and max_new_tokens) are not decoded again; the
    others are decoded in batches through `decoder.generate_batch(..., method="standard")` with no documents and
    appended to the file after every batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not model:
        raise ValueError("model (the id the closed-book cache is keyed by) must be a non-empty string")
    path = Path(path)
    cached = read_closed_book(path, model, max_new_tokens, repair=True)
    unique = distinct_questions(questions)
    todo = [q for q in unique if question_key(model, q) not in cached]
    if todo:
        path.parent.mkdir(parents=True, exist_ok=True)
        quiet = _DropNoDocumentsNote()
        prompting = logging.getLogger("fides_rag.generation.prompting")
        prompting.addFilter(quiet)
        try:
            with path.open("a", encoding="utf-8") as handle:
                for start in range(0, len(todo), batch_size):
                    batch = todo[start : start + batch_size]
                    results = decoder.generate_batch(
                        batch, [[] for _ in batch], method="standard", max_new_tokens=max_new_tokens
                    )
                    for question, result in zip(batch, results):
                        key = question_key(model, question)
                        cached[key] = result.text
                        handle.write(
                            json.dumps(
                                {
                                    "key": key,
                                    "model": model,
                                    "max_new_tokens": max_new_tokens,
                                    "question": question,
                                    "answer": result.text,
                                },
                                ensure_ascii=False,
                            )
                            + "\n"
                        )
                    handle.flush()
                    if on_batch is not None:
                        on_batch(len(batch))
        finally:
            prompting.removeFilter(quiet)
    return {q: cached[question_key(model, q)] for q in unique}
