import numpy as np
import pytest

from fides_rag.eval.significance import paired_bootstrap


def test_identical_methods():
    a = [1, 0, 1, 1, 0, 0, 1, 0] * 5
    test = paired_bootstrap(a, a)
    assert test["diff"] == 0.0
    assert test["ci_low"] <= 0.0 <= test["ci_high"]
    assert test["p_value"] == pytest.approx(1.0)
    assert test["samples"] == 1000 and test["n"] == 40


def test_clear_difference():
    rng = np.random.default_rng(1)
    a = (rng.random(200) < 0.8).astype(float)
    b = (rng.random(200) < 0.3).astype(float)
    test = paired_bootstrap(a, b)
    assert test["diff"] > 0.3
    assert test["ci_low"] > 0
    assert test["p_value"] < 0.01
    assert paired_bootstrap(b, a)["ci_high"] < 0


def test_noise_difference_not_significant():
    a = [1, 0] * 20
    b = [0, 1] * 20  # same mean, perfectly anti-paired
    test = paired_bootstrap(a, b)
    assert test["ci_low"] < 0 < test["ci_high"] and test["p_value"] > 0.5


def test_deterministic_and_validates():
    assert paired_bootstrap([1, 0, 1], [0, 0, 1], seed=3) == paired_bootstrap([1, 0, 1], [0, 0, 1], seed=3)
    with pytest.raises(ValueError):
        paired_bootstrap([1, 0], [1])
    assert paired_bootstrap([], [])["p_value"] is None


@pytest.mark.parametrize("samples", [0, -1, 2.5])
def test_resample_count_must_be_a_positive_integer(samples):
    with pytest.raises(ValueError, match="samples .* must be an integer >= 1"):
        paired_bootstrap([1, 0], [0, 0], samples=samples)


def _width(test):
    return test["ci_high"] - test["ci_low"]


def test_resampling_questions_undoes_the_narrowing_that_repeated_rows_cause():
    rng = np.random.default_rng(3)
    a = (rng.random(60) < 0.6).astype(float)
    b = (rng.random(60) < 0.5).astype(float)
    once = paired_bootstrap(a, b, samples=4000)
    repeated_a, repeated_b = np.repeat(a, 5), np.repeat(b, 5)  # every question asked on 5 identical rows
    questions = np.repeat(np.arange(60), 5).tolist()
    by_row = paired_bootstrap(repeated_a, repeated_b, samples=4000)
    by_question = paired_bootstrap(repeated_a, repeated_b, samples=4000, clusters=questions)
    assert (
        by_question["diff"] == pytest.approx(once["diff"]) and by_question["clusters"] == 60 and by_question["n"] == 300
    )
    assert _width(by_row) < 0.6 * _width(once)
    assert _width(by_question) == pytest.approx(_width(once), rel=0.2)


def test_one_question_per_row_matches_the_row_bootstrap():
    rng = np.random.default_rng(4)
    a, b = rng.random(150), rng.random(150) + 0.1
    rows = paired_bootstrap(a, b, samples=4000)
    clustered = paired_bootstrap(a, b, samples=4000, clusters=list(range(150)))
    assert clustered["diff"] == pytest.approx(rows["diff"])
    assert clustered["ci_low"] == pytest.approx(rows["ci_low"], abs=0.02) and clustered["ci_high"] == pytest.approx(
        rows["ci_high"], abs=0.02
    )
    assert rows["clusters"] is None


def test_few_questions_get_the_exact_sign_flip_p_value():
    # three questions, all in favour of a: of the 8 sign patterns only all-plus and all-minus reach the observed |mean|
    test = paired_bootstrap([1, 1, 1, 1, 0, 1], [0, 0, 0, 0, 0, 0], clusters=["q1", "q1", "q2", "q3", "q3", "q3"])
    assert test["p_value"] == pytest.approx(2 / 8)
    assert test["ci_low"] > 0 and test["clusters"] == 3
    same = paired_bootstrap([1, 0, 1], [1, 0, 1], clusters=["x", "y", "y"])
    assert same["p_value"] == 1.0 and same["ci_low"] == same["ci_high"] == 0.0


def test_clusters_need_one_label_per_example():
    with pytest.raises(ValueError, match="one label per example"):
        paired_bootstrap([1, 0, 1], [0, 0, 1], clusters=["a", "b"])
