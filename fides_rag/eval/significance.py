"""Paired bootstrap CI and paired permutation p-value between two methods scored on the same examples (scipy.stats)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from fides_rag.extras import require


def _mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def paired_bootstrap(
    scores_a: Sequence[float], scores_b: Sequence[float], *, samples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """Paired test of mean(a) - mean(b) over the same examples (a[i] and b[i] score example i).

    Returns:
    - diff: the observed mean(a) - mean(b) (in the scores' units; x100 for percent points),
    - ci_low, ci_high: the two-sided percentile interval at `confidence` of `samples` (B = 1000) paired
      bootstrap resamples of the examples (`scipy.stats.bootstrap(paired=True, method="percentile")`),
    - p_value: two-sided paired permutation test of the same statistic, swapping a[i] and b[i] at random
      (`scipy.stats.permutation_test(permutation_type="samples")`, `samples` resamples, exact when 2^n is fewer);
      identical methods give p = 1,
    - n, samples, confidence.
    """
    stats = require("scipy.stats", "eval", purpose="the paired bootstrap")
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two 1-d sequences of the same length, got {a.shape} and {b.shape}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples (bootstrap resamples) must be an integer >= 1, got {samples!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    n = len(a)
    if n == 0:
        return {"diff": None, "ci_low": None, "ci_high": None, "p_value": None, "n": 0, "samples": samples, "confidence": confidence}
    diff = float(_mean_difference(a, b))
    if n == 1 or np.all(a - b == a[0] - b[0]):
        low = high = diff  # every resample has the same difference (scipy warns and returns NaN here)
    else:
        with warnings.catch_warnings():  # few distinct values: scipy's "degenerate" warning, the interval is still the percentiles
            warnings.simplefilter("ignore", getattr(stats, "DegenerateDataWarning", RuntimeWarning))
            ci = stats.bootstrap((a, b), _mean_difference, paired=True, vectorized=True, n_resamples=samples,
                                 confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed)).confidence_interval
        low, high = float(ci.low), float(ci.high)
    if np.all(a == b):
        p = 1.0
    else:
        p = float(stats.permutation_test((a, b), _mean_difference, permutation_type="samples", vectorized=True,
                                         n_resamples=samples, alternative="two-sided", rng=np.random.default_rng(seed)).pvalue)
    return {"diff": diff, "ci_low": low, "ci_high": high, "p_value": min(1.0, p), "n": n, "samples": samples, "confidence": confidence}
