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
