"""The closed-book lane: one no-document answer per distinct question, submitted to the engine's continuous batching,
cached per settings, resumable, and stopped where a scan has enough."""

import json
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from fides_rag.decoder import FidesDecoder
from fides_rag.eval.closed_book import (
    ClosedBookSettings,
    answered_questions,
    closed_book_answers,
    closed_book_settings,
    distinct_questions,
    question_key,
    read_closed_book,
)

SETTINGS = ClosedBookSettings(model="m", dataset="d", prompt_sha256="p", max_new_tokens=7)


class _Handle:
    def __init__(self, future: Future) -> None:
        self.future, self.cancelled = future, False

    def cancel(self) -> None:
        self.cancelled = True


class SubmittingDecoder:
    """Answers "A:<question>" through `submit`, finishing requests in the order `finish` picks (a stand-in for the
    engine: futures resolve when later submissions arrive), and records what it was asked and the most in flight."""

    def __init__(self, fail_after: int | None = None, finish_last_first: bool = False) -> None:
        self.asked: list[str] = []
        self.options: list[dict] = []
        self.pending: list[tuple[str, Future]] = []
        self.handles: list[_Handle] = []
        self.fail_after, self.finish_last_first = fail_after, finish_last_first
        self.most_in_flight = 0

    def submit(self, question, documents=None, **options):
        if self.fail_after is not None and len(self.asked) >= self.fail_after:
            raise KeyboardInterrupt
        self.asked.append(question)
        self.options.append({"documents": documents, **options})
        future: Future = Future()
        self.pending.append((question, future))
        self.most_in_flight = max(self.most_in_flight, len(self.pending))
        handle = _Handle(future)
        self.handles.append(handle)
        return handle

    def finish_one(self) -> None:
        question, future = self.pending.pop(-1 if self.finish_last_first else 0)
        future.set_result(SimpleNamespace(text=f"A:{question}"))


def _run(decoder, questions, path, settings=SETTINGS, in_flight=2, **options):
    """The lane with `decoder` finishing one request whenever the lane waits (patched `wait`)."""
    import fides_rag.eval.closed_book as closed_book

    real_wait = closed_book.wait

    def wait(futures, return_when):
        decoder.finish_one()
        return real_wait(futures, return_when=return_when)

    closed_book.wait = wait
    try:
        return closed_book_answers(decoder, questions, path, settings=settings, in_flight=in_flight, **options)
    finally:
        closed_book.wait = real_wait


def test_each_distinct_question_is_decoded_once_without_documents_by_standard(tmp_path):
    decoder = SubmittingDecoder()
    answers = _run(decoder, ["q1", "q2", "q1", "q3", "q2"], tmp_path / "cb.jsonl")
    assert decoder.asked == ["q1", "q2", "q3"]
    assert answers == {"q1": "A:q1", "q2": "A:q2", "q3": "A:q3"}
    assert all(o["method"] == "standard" and o["max_new_tokens"] == 7 and o["documents"] == [] for o in decoder.options)
    lines = [json.loads(line) for line in (tmp_path / "cb.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == [question_key("m", q) for q in ("q1", "q2", "q3")]
    assert all(line["dataset"] == "d" and line["prompt_sha256"] == "p" for line in lines)


def test_the_lane_keeps_in_flight_questions_submitted_and_answers_in_question_order(tmp_path):
    decoder = SubmittingDecoder(finish_last_first=True)
    questions = [f"q{i}" for i in range(7)]
    answers = _run(decoder, questions, tmp_path / "cb.jsonl", in_flight=3)
    assert decoder.most_in_flight == 3
    assert list(answers) == questions  # question order, whatever order the requests finished in


def test_an_interrupted_lane_resumes_with_only_the_missing_questions(tmp_path):
    path = tmp_path / "cb.jsonl"
    with pytest.raises(KeyboardInterrupt):
        _run(SubmittingDecoder(fail_after=2), ["q1", "q2", "q3"], path, in_flight=1)
    with path.open("a") as handle:
        handle.write('{"key": "half-writ')  # a line cut by the interrupt
    again = SubmittingDecoder()
    answers = _run(again, ["q1", "q2", "q3"], path)
    assert again.asked == ["q3"] and answers == {"q1": "A:q1", "q2": "A:q2", "q3": "A:q3"}
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_an_interrupt_cancels_what_is_still_in_flight(tmp_path):
    decoder = SubmittingDecoder(fail_after=3)
    with pytest.raises(KeyboardInterrupt):
        _run(decoder, ["q1", "q2", "q3", "q4"], tmp_path / "cb.jsonl", in_flight=2)
    assert [h.cancelled for h in decoder.handles] == [False, False, True]


@pytest.mark.parametrize(
    "other",
    [
        ClosedBookSettings(model="m2", dataset="d", prompt_sha256="p", max_new_tokens=7),
        ClosedBookSettings(model="m", dataset="other-dataset", prompt_sha256="p", max_new_tokens=7),
        ClosedBookSettings(model="m", dataset="d", prompt_sha256="another template", max_new_tokens=7),
        ClosedBookSettings(model="m", dataset="d", prompt_sha256="p", max_new_tokens=8),
    ],
)
def test_a_cache_made_with_other_settings_is_refused_never_mixed(tmp_path, other):
    path = tmp_path / "cb.jsonl"
    _run(SubmittingDecoder(), ["q1"], path)
    before = path.read_text()
    with pytest.raises(ValueError, match="other settings") as error:
        _run(SubmittingDecoder(), ["q1", "q2"], path, settings=other)
    changed = [
        f for f in ("model", "dataset", "prompt_sha256", "max_new_tokens") if getattr(other, f) != getattr(SETTINGS, f)
    ]
    assert all(f"{name} " in str(error.value) for name in changed) and "another output folder" in str(error.value)
    assert path.read_text() == before


def test_a_cache_written_without_its_settings_is_read_but_not_appended_to(tmp_path):
    path = tmp_path / "cb.jsonl"
    path.write_text(json.dumps({"key": question_key("m", "q1"), "model": "m", "max_new_tokens": 7, "answer": "a"}))
    assert read_closed_book(path, {"model": "m", "max_new_tokens": 7}) == {question_key("m", "q1"): "a"}
    with pytest.raises(ValueError, match="dataset None"):
        _run(SubmittingDecoder(), ["q1"], path)


def test_answered_questions_are_the_questions_the_cache_answers_with_those_settings_in_question_order(tmp_path):
    path = tmp_path / "cb.jsonl"
    _run(SubmittingDecoder(), ["q1", "q2"], path)
    answered = answered_questions(path, ["q3", "q2", "q1"], {"model": "m", "max_new_tokens": 7})
    assert list(answered.items()) == [("q2", "A:q2"), ("q1", "A:q1")]
    assert answered_questions(path, ["q1"], {"model": "m", "max_new_tokens": 8}) == {}
    assert answered_questions(path, ["q1"], {"model": "m2", "max_new_tokens": 7}) == {}
    with pytest.raises(ValueError, match="must name the model and max_new_tokens"):
        read_closed_book(path, {"model": "m"})


def test_the_lane_stops_at_the_first_question_by_which_the_scan_has_enough(tmp_path):
    decoder = SubmittingDecoder()
    questions = [f"q{i}" for i in range(10)]
    seen: list[str] = []

    def enough(question: str, answer: str) -> bool:
        seen.append(question)
        return question == "q3"

    answers = _run(decoder, questions, tmp_path / "cb.jsonl", in_flight=3, enough=enough)
    assert list(answers) == ["q0", "q1", "q2", "q3"] and seen == list(answers)
    assert len(decoder.asked) < len(questions) and any(h.cancelled for h in decoder.handles)
    again = SubmittingDecoder()
    assert _run(again, questions, tmp_path / "cb.jsonl", enough=lambda q, a: q == "q3") == answers
    assert again.asked == []  # resumed from the cache, stopping at the same question


def test_a_bad_line_inside_the_cache_is_an_error_naming_it(tmp_path):
    path = tmp_path / "cb.jsonl"
    path.write_text(
        '{"key": "k", "model": "m", "answer": "a", "max_new_tokens": 32}\nnot json\n'
        '{"key": "k2", "model": "m", "answer": "b"}\n'
    )
    with pytest.raises(ValueError, match="line 2"):
        read_closed_book(path, {"model": "m", "max_new_tokens": 32})


def test_in_flight_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="in_flight"):
        closed_book_answers(SubmittingDecoder(), ["q1"], tmp_path / "cb.jsonl", settings=SETTINGS, in_flight=0)


def test_distinct_questions_keep_first_seen_order():
    assert distinct_questions(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


def test_closed_book_answer_is_the_decoders_no_document_answer_whatever_else_is_in_flight(
    tokenizer, tiny_llama, tmp_path
):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    questions = ["What is the capital of France?", "Who wrote Hamlet?", "Why is the sky blue?", "Name a prime."]
    settings = closed_book_settings(decoder, model="tiny", dataset="probe", max_new_tokens=3)
    answers = closed_book_answers(decoder, questions, tmp_path / "cb.jsonl", settings=settings, in_flight=3)
    for question in questions:
        alone = decoder.generate(question, [], method="standard", max_new_tokens=3)
        assert answers[question] == alone.text


def test_the_prompt_fingerprint_follows_the_template(tokenizer, tiny_llama):
    plain = closed_book_settings(FidesDecoder(tiny_llama, tokenizer), model="t", dataset="d", max_new_tokens=3)
    again = closed_book_settings(FidesDecoder(tiny_llama, tokenizer), model="t", dataset="d", max_new_tokens=3)
    assert plain == again and len(plain.prompt_sha256) == 64
    with pytest.raises(ValueError, match="dataset"):
        closed_book_settings(FidesDecoder(tiny_llama, tokenizer), model="t", dataset="", max_new_tokens=3)
