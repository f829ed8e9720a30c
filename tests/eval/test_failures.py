"""Failure classes: every answer in exactly one class, the first that applies, on the metrics' normalisation."""

import pytest

from fides_rag.eval.failures import (
    ANSWER_CLASSES,
    FAILURE_CLASSES,
    answer_class,
    count_failures,
    is_passage_span,
    no_stop_cause,
)

PASSAGE = "The Eiffel Tower was built in Lyon by Gustave Eiffel's company in 1889."
RIGHT = ["Lyon", "Lyons"]
MEMORY = ["Paris"]


def _class(prediction: str, answers=RIGHT, memory=MEMORY, passages=(PASSAGE,)) -> str:
    return answer_class(prediction, answers, memory, passages)


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        ("Lyon", "right"),
        ("Lyons", "right"),  # any alias
        ("  the LYON. ", "right"),  # case, punctuation and articles are normalised away
        ("Paris", "memorised"),
        ("Paris!", "memorised"),
        ("Lyon, France", "no_stop"),
        ("It was built in Lyon.", "no_stop"),  # a passage span too, but the right answer comes first
        ("Gustave Eiffel's company", "other_span"),
        ("in 1889", "other_span"),
        ("Marseille", "other"),
        ("Paris, France", "other"),  # the memorised answer with more words is not what MemR counts
        ("", "other"),
        ("   ", "other"),
        ("...", "other"),  # nothing left after normalisation: never a span
    ],
)
def test_each_prediction_falls_in_its_class(prediction, expected):
    assert _class(prediction) == expected


def test_right_comes_before_memorised_when_the_answers_overlap():
    assert _class("Lyon", answers=["Lyon"], memory=["Lyon"]) == "right"


def test_memorised_comes_before_other_span_when_the_passage_holds_the_memorised_answer():
    assert _class("Paris", passages=["Lyon, not Paris, holds the tower."]) == "memorised"


def test_a_row_without_memory_answers_has_no_memorised_class():
    assert _class("Paris", memory=[]) == "other"
    assert _class("Eiffel", memory=[]) == "other_span"


def test_whole_tokens_only_a_longer_word_holding_the_answer_is_not_no_stop():
    assert _class("Lyonnais", answers=["Lyon"]) == "other"
    assert _class("Lyonnais", answers=["Lyon"], passages=["Lyonnais cooking"]) == "other_span"


def test_a_span_of_any_passage_the_model_saw_counts():
    assert is_passage_span("the Eiffel Tower", ["Nothing here.", PASSAGE])
    assert not is_passage_span("Eiffel built", [PASSAGE])  # words of the passage, but not a run of them
    assert not is_passage_span("", [PASSAGE]) and not is_passage_span("Lyon", [])


def test_every_class_is_one_of_the_listed_ones_and_right_is_no_failure():
    assert ANSWER_CLASSES[0] == "right" and FAILURE_CLASSES == ("memorised", "no_stop", "other_span", "other")


def test_count_failures_gives_every_failure_class_and_leaves_right_out():
    counted = count_failures(["right", "memorised", "other", "memorised", "right"])
    assert counted == {"memorised": 2, "no_stop": 0, "other_span": 0, "other": 1}
    assert count_failures([]) == dict.fromkeys(FAILURE_CLASSES, 0)
    with pytest.raises(ValueError, match="unknown answer class 'wrong'"):
        count_failures(["wrong"])


@pytest.mark.parametrize(
    ("tokens", "standard", "standard_class", "finish", "cause"),
    [
        ([5, 6, 7, 9], [5, 6, 2], "right", "eos", "past_standard_end"),  # standard's tokens, then on past its end
        ([5, 8, 6, 2], [5, 6, 2], "right", "eos", "diverged_first"),  # left standard's tokens before its end
        ([8, 5, 6, 2], [5, 6, 2], "memorised", "stop", "diverged_first"),
        ([5, 6, 7, 2], [5, 6, 7, 9, 2], "no_stop", "eos", "standard_runs_on"),  # standard goes on too
        ([5, 6, 7, 2], [5, 6, 7, 9], "other", "length", "standard_runs_on"),  # standard ran to the limit
    ],
)
def test_a_no_stop_answer_is_set_beside_standards_answer_on_the_same_row(
    tokens, standard, standard_class, finish, cause
):
    assert no_stop_cause(tokens, standard, standard_class, finish) == cause


def test_an_unknown_class_of_standards_answer_is_refused():
    with pytest.raises(ValueError, match="unknown answer class 'wrong'"):
        no_stop_cause([1], [1, 2], "wrong", "eos")
