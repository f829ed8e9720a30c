"""Paired bootstrap CI and paired permutation p-value between two methods scored on the same examples (scipy.stats),
over the examples or over clusters of them (e.g. NQ-Swap's rows that share one question)."""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from fides_rag.extras import require


def _mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def paired_bootstrap(
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    *,
    samples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    clusters: Sequence[Hashable] | None = None,
) -> dict[str, Any]:
    """Paired test of mean(a) - mean(b) over the same examples (a[i] and b[i] score example i).

    Returns:
    - diff: the observed mean(a) - mean(b) (in the scores' units; x100 for percent points),
    - ci_low, ci_high: the two-sided percentile interval at `confidence` of `samples` (B = 1000) paired
      bootstrap resamples of the examples (`scipy.stats.bootstrap(paired=True, method="percentile")`),
    - p_value: two-sided paired permutation test of the same statistic, swapping a[i] and b[i] at random
      (`scipy.stats.permutation_test(permutation_type="samples")`, `samples` resamples, exact when 2^n is fewer);
      identical methods give p = 1,
    - n, samples, confidence, clusters (the number of clusters; None when resampling examples).

    `clusters` (one label per example) resamples whole clusters instead: examples that share a label (NQ-Swap's rows
    of one question) are not independent, and resampling them one by one makes the interval too narrow. The
    interval is then the percentile interval of the pooled mean difference over resampled clusters, and the p-value
    that of flipping the sign of each cluster's differences (exact when 2^clusters <= samples).
    """
    stats = require("scipy.stats", "eval", purpose="the paired bootstrap")
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two 1-d sequences of the same length, got {a.shape} and {b.shape}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples (bootstrap resamples) must be an integer >= 1, got {samples!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if clusters is not None and len(clusters) != len(a):
        raise ValueError(f"clusters must give one label per example: {len(clusters)} labels for {len(a)} examples")
    n = len(a)
    if n == 0:
        return {
            "diff": None,
            "ci_low": None,
            "ci_high": None,
            "p_value": None,
            "n": 0,
            "samples": samples,
            "confidence": confidence,
            "clusters": None if clusters is None else 0,
        }
    if clusters is not None:
        return _cluster_test(a - b, clusters, samples, confidence, seed)
    diff = float(_mean_difference(a, b))
    if n == 1 or np.all(a - b == a[0] - b[0]):
        low = high = diff  # every resample has the same difference (scipy warns and returns NaN here)
    else:
        with (
            warnings.catch_warnings()
        ):  # few distinct values: scipy's "degenerate" warning, the interval is still the percentiles
            warnings.simplefilter("ignore", getattr(stats, "DegenerateDataWarning", RuntimeWarning))
            ci = stats.bootstrap(
                (a, b),
                _mean_difference,
                paired=True,
                vectorized=True,
                n_resamples=samples,
                confidence_level=confidence,
                method="percentile",
                rng=np.random.default_rng(seed),
            ).confidence_interval
        low, high = float(ci.low), float(ci.high)
    if np.all(a == b):
        p = 1.0
    else:
        p = float(
            stats.permutation_test(
                (a, b),
                _mean_difference,
                permutation_type="samples",
                vectorized=True,
                n_resamples=samples,
                alternative="two-sided",
                rng=np.random.default_rng(seed),
            ).pvalue
        )
    return {
        "diff": diff,
        "ci_low": low,
        "ci_high": high,
        "p_value": min(1.0, p),
        "n": n,
        "samples": samples,
        "confidence": confidence,
        "clusters": None,
    }


def _cluster_test(
    d: np.ndarray, clusters: Sequence[Hashable], samples: int, confidence: float, seed: int
) -> dict[str, Any]:
    """The cluster bootstrap and sign-flip test of the mean of the paired differences `d` ([n])."""
    codes: dict[Hashable, int] = {}
    index = np.array([codes.setdefault(c, len(codes)) for c in clusters])
    k = len(codes)
    sums = np.bincount(index, weights=d, minlength=k)  # [k] each cluster's summed difference
    counts = np.bincount(index, minlength=k).astype(float)  # [k]
    diff = float(d.mean())
    rng = np.random.default_rng(seed)
    if k == 1 or np.all(d == d[0]):
        low = high = diff
    else:
        draws = rng.integers(0, k, size=(samples, k))  # [B, k] clusters drawn with replacement
        pooled = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)  # [B]
        tail = 100 * (1 - confidence) / 2
        low, high = (float(x) for x in np.percentile(pooled, [tail, 100 - tail]))
    if np.all(d == 0):
        p = 1.0
    else:
        if 2**k <= samples:  # every sign pattern, exactly
            signs = 1 - 2 * ((np.arange(2**k)[:, None] >> np.arange(k)) & 1)  # [2^k, k]
            flipped = np.abs(signs @ sums) / len(d)
            p = float(np.mean(flipped >= abs(diff) * (1 - 1e-12)))
        else:
            signs = rng.choice([-1.0, 1.0], size=(samples, k))  # [B, k]
            flipped = np.abs(signs @ sums) / len(d)
            p = float((np.sum(flipped >= abs(diff) * (1 - 1e-12)) + 1) / (samples + 1))
    return {
        "diff": diff,
        "ci_low": low,
        "ci_high": high,
        "p_value": min(1.0, p),
        "n": len(d),
        "samples": samples,
        "confidence": confidence,
        "clusters": k,
    }
