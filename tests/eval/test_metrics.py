import pytest

from fides_rag.eval.metrics import (
    aggregate,
    containment,
    contains_answer,
    exact_match,
    normalize_answer,
    score_prediction,
    token_f1,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  An   apple, a pear!  ", "apple pear"),
        ("Theatre", "theatre"),  # article only as a whole word
        ("U.S.A.", "usa"),
        ("Jean-Paul", "jeanpaul"),
        ("the", ""),
        ("", ""),
        ("A\tB\nC", "b c"),  # "a" is an article
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_any_alias():
    assert exact_match("the Yuliya Snigir.", ["Timothy B. Schmit", "Yuliya Snigir"]) == 1.0
    assert exact_match("Yuliya", ["Yuliya Snigir"]) == 0.0
    assert exact_match("anything", []) == 0.0


def test_token_f1_hand_computed():
    # pred tokens {yuliya, snigir, actress}, gold {yuliya, snigir}: P = 2/3, R = 1, F1 = 0.8
    assert token_f1("Yuliya Snigir, actress", ["Yuliya Snigir"]) == pytest.approx(0.8)
    # best alias wins
    assert token_f1("Paris", ["Lyon", "Paris France"]) == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert token_f1("the", ["a"]) == 1.0  # both empty after normalisation
    assert token_f1("the", ["Lyon"]) == 0.0
    # repeated tokens count once per occurrence: pred {a:..} -> "lyon lyon" vs "lyon": P 1/2, R 1
    assert token_f1("Lyon Lyon", ["Lyon"]) == pytest.approx(2 / 3)


def test_contains_answer():
    assert contains_answer("I think it is the politician.", ["politician", "pol"]) == 1.0
    assert contains_answer("no idea", ["politician"]) == 0.0
    assert contains_answer("anything", ["the"]) == 0.0  # empty alias never counts
    assert contains_answer("a political scientist", ["pol"]) == 0.0  # whole tokens only
    assert contains_answer("It opened in 1889.", ["8"]) == 0.0
    assert contains_answer("It opened in 1889.", ["1889"]) == 1.0
    assert contains_answer("Born in New York City", ["new york"]) == 1.0


def test_score_prediction_conflict_and_control():
    conflict = score_prediction("Timothy B. Schmit", ["Yuliya Snigir"], ["Timothy B. Schmit"])
    assert conflict == {"cf": 0.0, "em": 0.0, "containment": 0.0, "f1": 0.0, "memorized": 1.0, "accuracy": 0.0}
    control = score_prediction("Lyon", ["Lyon"])
    assert control["cf"] is None and control["memorized"] is None and control["em"] == 1.0


def test_aggregate_means_over_defined_samples():
    scores = [
        score_prediction("Lyon", ["Lyon"], ["Paris"]),
        score_prediction("Paris", ["Lyon"], ["Paris"]),
        score_prediction("Lyon", ["Lyon"]),
    ]
    agg = aggregate(scores)
    assert agg["cf"] == pytest.approx(50.0) and agg["n_cf"] == 2
    assert agg["em"] == pytest.approx(200 / 3) and agg["n_em"] == 3
    assert agg["memorized"] == pytest.approx(50.0)
    assert aggregate([])["em"] is None


def test_containment_accepts_the_answer_with_at_most_three_extra_words():
    assert containment("Paris", ["Paris"]) == 1.0
    assert containment("Paris, the capital of France", ["Paris"]) == 1.0  # "capital of france" after the article drops
    assert containment("It is in Paris I think", ["Paris"]) == 0.0  # 5 words beyond the answer
    assert containment("New York City", ["new york"]) == 1.0
    assert containment("Parisian", ["Paris"]) == 0.0  # whole tokens only
    assert containment("", ["Paris"]) == 0.0 and containment("Paris", [""]) == 0.0


def test_exact_match_implies_containment():
    for prediction, answer in [("The Eiffel Tower", "eiffel tower"), ("1889", "1889"), ("Lyon!", "lyon")]:
        assert exact_match(prediction, [answer]) == 1.0 and containment(prediction, [answer]) == 1.0
