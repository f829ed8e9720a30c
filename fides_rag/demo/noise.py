"""Seeded noise injection: replace a share of the retrieved documents with irrelevant ones.

For one question, a single seeded permutation of the k positions and a single seeded order of the
candidate distractors are drawn; noise level s replaces the first round(s * k) positions of that
permutation with the first distractors of that order. So the replaced positions are random but
reproducible, 0% leaves the list unchanged, and the levels are nested (the documents swapped at 20%
are also swapped at 50%), which keeps the comparison between levels paired.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fides_rag.demo.metrics import contains_alias

T = TypeVar("T")


def noise_count(share: float, k: int) -> int:
    """How many of k documents a noise share replaces: share * k rounded half up."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"noise share must lie in [0, 1], got {share!r}")
    return min(k, math.floor(share * k + 0.5 + 1e-9))


@dataclass(frozen=True)
class NoisyDocuments:
    """The documents given to the reader at one noise level and which positions were replaced."""

    share: float
    documents: tuple
    replaced: tuple[int, ...]


def inject_noise(
    documents: Sequence[T],
    shares: Sequence[float],
    pool: Sequence[T],
    aliases: Sequence[str],
    *,
    seed: int,
    key: str = "",
    text_of: Callable[[T], str] = str,
    protect_gold: bool = False,
) -> list[NoisyDocuments]:
    """One NoisyDocuments per share: the retrieved `documents` with round(share*k) of them swapped for
    random members of `pool` that contain no gold alias and are not already retrieved.

    `key` (e.g. the question id) and `seed` determine the draw. With `protect_gold`, positions whose
    document contains a gold alias are replaced only after every other position.
    """
    k = len(documents)
    rng = random.Random(f"fides-demo:{seed}:{key}")
    positions = list(range(k))
    rng.shuffle(positions)
    if protect_gold:
        positions.sort(key=lambda i: contains_alias(text_of(documents[i]), aliases))  # stable: keeps the shuffle
    retrieved = {text_of(d) for d in documents}
    needed = max((noise_count(s, k) for s in shares), default=0)
    distractors: list[T] = []
    chosen: set[str] = set()
    for index in rng.sample(range(len(pool)), len(pool)) if needed else ():  # a seeded random order, checked lazily
        text = text_of(pool[index])
        if text in retrieved or text in chosen or contains_alias(text, aliases):
            continue
        distractors.append(pool[index])
        chosen.add(text)
        if len(distractors) == needed:
            break
    if len(distractors) < needed:
        raise ValueError(
            f"need {needed} irrelevant documents for question {key!r} but the pool has only {len(distractors)} "
            "without a gold alias"
        )
    out = []
    for share in shares:
        n = noise_count(share, k)
        noisy = list(documents)
        for position, distractor in zip(positions[:n], distractors):
            noisy[position] = distractor
        out.append(NoisyDocuments(share, tuple(noisy), tuple(sorted(positions[:n]))))
    return out
