"""Paired bootstrap between two methods scored on the same examples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def paired_bootstrap(
    scores_a: Sequence[float], scores_b: Sequence[float], *, samples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """Paired bootstrap of mean(a) - mean(b) over the same examples (a[i] and b[i] score example i).

    Resamples the examples with replacement `samples` times (B = 1000 by default) and returns:
    - diff: the observed mean(a) - mean(b) (in the scores' units; x100 for percent points),
    - ci_low, ci_high: the two-sided percentile interval of the resampled differences at `confidence`,
    - p_value: two-sided, 2 * min(P*(d <= 0), P*(d >= 0)) with add-one smoothing
      ((1 + count) / (B + 1)), capped at 1, where P* is the share of resampled differences;
      identical methods give p = 1, a clear difference p ~ 2 / (B + 1),
    - n, samples, confidence.
    """
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores must be two 1-d sequences of the same length, got {a.shape} and {b.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    n = len(a)
    if n == 0:
        return {"diff": None, "ci_low": None, "ci_high": None, "p_value": None, "n": 0, "samples": samples, "confidence": confidence}
    delta = a - b
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(samples, n))
    diffs = delta[idx].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(diffs, [tail, 1 - tail])
    le, ge = int((diffs <= 0).sum()), int((diffs >= 0).sum())
    p = min(1.0, 2 * (1 + min(le, ge)) / (samples + 1))
    return {
        "diff": float(delta.mean()), "ci_low": float(low), "ci_high": float(high), "p_value": float(p),
        "n": n, "samples": samples, "confidence": confidence,
    }
