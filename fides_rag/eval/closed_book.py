"""The closed-book lane of `fides-rag eval --strata`: each distinct question answered without documents, cached.

The answer is the decoder's own no-context path (`method="standard"` with no documents: the template's no-context
instruction, greedy), so it is what the model says from memory. A closed-book answer depends on the question alone,
so each distinct question is decoded once. The lane keeps the engine full: it holds up to `in_flight` questions
submitted at once and submits the next as each one finishes (continuous batching; in exact mode a greedy answer does
not depend on what else is in flight, so it equals the answer decoded alone).

Answers are appended to a JSONL cache, one line per question: the `ClosedBookSettings` that made it (model, dataset,
a fingerprint of the no-context prompt, max_new_tokens), the question, its `key` (SHA-256 of the model id and the
question text) and the answer. An interrupted lane resumes: the questions already in the file are kept, a
half-written last line is cut. A file made with other settings is refused, never mixed. Files written before the
lane recorded its dataset and prompt are read (by model and max_new_tokens) but not appended to.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder, RequestHandle

CLOSED_BOOK = "closed_book.jsonl"
"""The cache file of the closed-book answers, in the run folder."""
DEFAULT_IN_FLIGHT = 64
"""Questions the lane keeps submitted at once (the engine batches them and admits more as rows finish)."""
_NO_DOCUMENTS_NOTE = "no documents were given"
_PROBE_QUESTION = "<closed-book probe question>"


@dataclass(frozen=True)
class ClosedBookSettings:
    """What a closed-book answer depends on; every line of a cache carries them and a lane refuses other ones."""

    model: str
    dataset: str
    prompt_sha256: str
    """SHA-256 of the no-context prompt rendered for a fixed probe question: the template, chat template and
    instruction the answers were decoded with."""
    max_new_tokens: int


def question_key(model: str, question: str) -> str:
    """The cache key of one closed-book answer: SHA-256 over the model id and the question text."""
    return hashlib.sha256(f"{model}\0{question}".encode()).hexdigest()


def distinct_questions(questions: Iterable[str]) -> list[str]:
    """The questions in first-seen order, each once."""
    return list(dict.fromkeys(questions))


def no_context_prompt_sha256(decoder: FidesDecoder) -> str:
    """The fingerprint of `decoder`'s no-context prompt (`ClosedBookSettings.prompt_sha256`)."""
    text, _ = decoder.prompts.render(_PROBE_QUESTION, None)
    return hashlib.sha256(text.encode()).hexdigest()


def closed_book_settings(decoder: FidesDecoder, *, model: str, dataset: str, max_new_tokens: int) -> ClosedBookSettings:
    """The settings of a lane decoding with `decoder`; a ValueError for an empty model id or dataset name."""
    if not model:
        raise ValueError("model (the id the closed-book cache is keyed by) must be a non-empty string")
    if not dataset:
        raise ValueError("dataset (the name the closed-book cache records) must be a non-empty string")
    return ClosedBookSettings(model, dataset, no_context_prompt_sha256(decoder), max_new_tokens)


def _differences(record: Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    return [
        f"{name} {record.get(name)!r} (this run: {value!r})"
        for name, value in settings.items()
        if record.get(name) != value
    ]


def read_closed_book(path: str | Path, settings: Mapping[str, Any], appending: bool = False) -> dict[str, str]:
    """key -> answer for the lines of `path` that carry the values of `settings` (none when there is no file).

    `settings` names at least model and max_new_tokens: the lane passes all of its `ClosedBookSettings`, a reader of
    caches written before lines carried their dataset and prompt passes those two. Lines with other values are
    skipped; with appending=True (the lane, about to add to the file) they are a ValueError that says which. A line
    that is not valid JSON can only be the half-written last line of an interrupted lane: it is skipped, and with
    appending=True cut from the file. A bad line anywhere else is a ValueError naming it."""
    if not {"model", "max_new_tokens"} <= set(settings):
        raise ValueError(f"closed-book settings must name the model and max_new_tokens, got {sorted(settings)}")
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
            differ = _differences(record, settings)
            if appending and differ:
                raise ValueError(
                    f"{path} holds closed-book answers made with other settings (line {number}: "
                    f"{'; '.join(differ)}); answers of another model, dataset or prompt are never mixed: use another "
                    "output folder, or move the file away to decode them again"
                )
            if not differ:
                answers[record["key"]] = record["answer"]
            keep = offset_next
        offset = offset_next
    if appending:
        if keep > len(raw):
            with path.open("ab") as handle:
                handle.write(b"\n")
        elif raw[keep:].strip():
            with path.open("r+b") as handle:
                handle.truncate(keep)
    return answers


def answered_questions(
    path: str | Path, questions: Sequence[str], settings: Mapping[str, Any], appending: bool = False
) -> dict[str, str]:
    """question -> cached answer, for those of `questions` the cache `path` answers (`read_closed_book` of
    `settings`), in question order."""
    cached = read_closed_book(path, settings, appending)
    model = settings["model"]
    return {q: cached[k] for q in questions if (k := question_key(model, q)) in cached}


def extend_prefix(
    prefix: dict[str, str],
    order: Sequence[str],
    answered: Mapping[str, str],
    enough: Callable[[str, str], bool] | None,
) -> bool:
    """Adds to `prefix` the answered questions that continue it in `order`, calling `enough(question, answer)` on
    each; True as soon as it does (the scan's last question), False when the next question has no answer yet."""
    while len(prefix) < len(order) and order[len(prefix)] in answered:
        question = order[len(prefix)]
        prefix[question] = answered[question]
        if enough is not None and enough(question, prefix[question]):
            return True
    return False


class _DropNoDocumentsNote(logging.Filter):
    """The lane decodes without documents on purpose: the decoder's warning about it would repeat per question."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_NO_DOCUMENTS_NOTE)


class _Lane:
    """The questions to decode, submitted `in_flight` at a time, and the answers in question order."""

    def __init__(
        self, decoder: FidesDecoder, todo: Sequence[str], settings: ClosedBookSettings, in_flight: int
    ) -> None:
        self.decoder, self.settings, self.in_flight = decoder, settings, in_flight
        self.waiting = list(reversed(todo))
        self.running: dict[Future[Any], tuple[str, RequestHandle]] = {}

    def fill(self) -> None:
        while self.waiting and len(self.running) < self.in_flight:
            question = self.waiting.pop()
            handle = self.decoder.submit(question, [], method="standard", max_new_tokens=self.settings.max_new_tokens)
            self.running[handle.future] = (question, handle)

    def finished(self) -> list[tuple[str, str]]:
        """Waits for at least one answer; (question, answer) of every request that finished."""
        done, _ = wait(list(self.running), return_when=FIRST_COMPLETED)
        out = []
        for future in done:
            question, _ = self.running.pop(future)
            out.append((question, future.result().text))
        return out

    def cancel(self) -> None:
        for _, handle in self.running.values():
            handle.cancel()
        self.running.clear()
        self.waiting.clear()


def closed_book_answers(
    decoder: FidesDecoder,
    questions: Sequence[str],
    path: str | Path,
    *,
    settings: ClosedBookSettings,
    in_flight: int = DEFAULT_IN_FLIGHT,
    on_answer: Callable[[int], None] | None = None,
    enough: Callable[[str, str], bool] | None = None,
) -> dict[str, str]:
    """question -> the model's closed-book answer, for the distinct questions of `questions`, in their order.

    Questions already answered in the cache `path` are not decoded again; the others are submitted to
    `decoder.submit(..., method="standard")` with no documents, up to `in_flight` at once, and each answer is
    appended to the file as it finishes. `enough(question, answer)` is called for the answers in question order
    (cached or new); once it returns True the lane stops, cancels what is still in flight (answers already
    finished stay in the cache) and returns the answers up to that question: a prefix of `questions` that does not
    depend on the order requests finished in. `on_answer(n)` reports answers as they arrive."""
    if in_flight < 1:
        raise ValueError(f"in_flight (closed-book questions submitted at once) must be >= 1, got {in_flight}")
    path = Path(path)
    order = distinct_questions(questions)
    answered = answered_questions(path, order, asdict(settings), appending=True)
    prefix: dict[str, str] = {}

    def extend() -> bool:
        return extend_prefix(prefix, order, answered, enough)

    if on_answer is not None and answered:
        on_answer(len(answered))
    if extend():
        return prefix
    lane = _Lane(decoder, [q for q in order if q not in answered], settings, in_flight)
    if not lane.waiting:
        return prefix
    path.parent.mkdir(parents=True, exist_ok=True)
    quiet = _DropNoDocumentsNote()
    prompting = logging.getLogger("fides_rag.generation.prompting")
    prompting.addFilter(quiet)
    try:
        with path.open("a", encoding="utf-8") as handle:
            lane.fill()
            while lane.running:
                finished = lane.finished()
                for question, answer in finished:
                    answered[question] = answer
                    record = {
                        **asdict(settings),
                        "key": question_key(settings.model, question),
                        "question": question,
                        "answer": answer,
                    }
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                handle.flush()
                if on_answer is not None:
                    on_answer(len(finished))
                if extend():
                    break
                lane.fill()
    finally:
        lane.cancel()
        prompting.removeFilter(quiet)
    return prefix
