"""The closed-book lane: one no-document answer per distinct question, cached per model and resumable."""

import json
from types import SimpleNamespace

import pytest

from fides_rag.decoder import FidesDecoder
from fides_rag.eval.closed_book import (
    closed_book_answers,
    distinct_questions,
    question_key,
    read_closed_book,
)


class CountingDecoder:
    """Answers "A:<question>" and records what it was asked (a stand-in for the decoder's batch API)."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.asked: list[str] = []
        self.calls: list[dict] = []
        self.fail_after = fail_after

    def generate_batch(self, questions, documents, **options):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt
        self.calls.append({"documents": documents, **options})
        self.asked += questions
        return [SimpleNamespace(text=f"A:{q}") for q in questions]


def test_each_distinct_question_is_decoded_once_without_documents_by_standard(tmp_path):
    decoder = CountingDecoder()
    questions = ["q1", "q2", "q1", "q3", "q2"]
    answers = closed_book_answers(decoder, questions, tmp_path / "cb.jsonl", model="m", max_new_tokens=7, batch_size=2)
    assert decoder.asked == ["q1", "q2", "q3"]
    assert answers == {"q1": "A:q1", "q2": "A:q2", "q3": "A:q3"}
    assert all(
        c["method"] == "standard" and c["max_new_tokens"] == 7 and all(d == [] for d in c["documents"])
        for c in decoder.calls
    )
    lines = [json.loads(line) for line in (tmp_path / "cb.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == [question_key("m", q) for q in ("q1", "q2", "q3")]


def test_an_interrupted_lane_resumes_with_only_the_missing_questions(tmp_path):
    path = tmp_path / "cb.jsonl"
    with pytest.raises(KeyboardInterrupt):
        closed_book_answers(CountingDecoder(fail_after=1), ["q1", "q2", "q3"], path, model="m", batch_size=2)
    with path.open("a") as handle:
        handle.write('{"key": "half-writ')  # a line cut by the interrupt
    again = CountingDecoder()
    answers = closed_book_answers(again, ["q1", "q2", "q3"], path, model="m", batch_size=2)
    assert again.asked == ["q3"] and answers["q1"] == "A:q1"
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_the_cache_is_keyed_by_model_and_max_new_tokens(tmp_path):
    path = tmp_path / "cb.jsonl"
    closed_book_answers(CountingDecoder(), ["q1"], path, model="m1", max_new_tokens=4)
    other = CountingDecoder()
    closed_book_answers(other, ["q1"], path, model="m2", max_new_tokens=4)
    longer = CountingDecoder()
    closed_book_answers(longer, ["q1"], path, model="m1", max_new_tokens=8)
    assert other.asked == ["q1"] and longer.asked == ["q1"]
    assert question_key("m1", "q1") != question_key("m2", "q1")
    assert len(read_closed_book(path, "m1", 4)) == 1 and len(path.read_text().splitlines()) == 3


def test_a_bad_line_inside_the_cache_is_an_error_naming_it(tmp_path):
    path = tmp_path / "cb.jsonl"
    path.write_text(
        '{"key": "k", "model": "m", "answer": "a", "max_new_tokens": 32}\nnot json\n'
        '{"key": "k2", "model": "m", "answer": "b"}\n'
    )
    with pytest.raises(ValueError, match="line 2"):
        read_closed_book(path, "m", 32)


def test_distinct_questions_keep_first_seen_order():
    assert distinct_questions(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


def test_closed_book_answer_is_the_decoders_no_document_answer(tokenizer, tiny_llama, tmp_path):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    questions = ["What is the capital of France?", "Who wrote Hamlet?"]
    answers = closed_book_answers(
        decoder, questions, tmp_path / "cb.jsonl", model="tiny", max_new_tokens=3, batch_size=2
    )
    for question in questions:
        alone = decoder.generate(question, [], method="standard", max_new_tokens=3)
        assert answers[question] == alone.text
