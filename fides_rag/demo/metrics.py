"""Alias accuracy and retrieval recall@k, on the one SQuAD normalisation of fides_rag.eval.metrics.

Accuracy follows the PopQA convention ("a gold alias appears in the output"): a normalised alias must
occur in the normalised answer as a contiguous run of whole tokens, so "pol" does not match
"political" and "8" does not match "1889".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fides_rag.eval.metrics import contains_answer, normalize_answer

__all__ = ["contains_alias", "is_correct", "normalize_answer", "recall_at_k"]


def contains_alias(text: str, aliases: Iterable[str]) -> bool:
    """Whether any alias, normalised, occurs in the normalised text as whole tokens."""
    return bool(contains_answer(text, aliases))


def is_correct(prediction: str, aliases: Sequence[str]) -> bool:
    """Accuracy of one answer: a normalised gold alias is contained in the normalised prediction."""
    return contains_alias(prediction, aliases)


def recall_at_k(
    retrieved_texts: Sequence[Sequence[str]], aliases: Sequence[Sequence[str]], k: int | None = None
) -> float:
    """Share of questions whose first k retrieved texts contain a gold alias (all of them when k is None)."""
    if len(retrieved_texts) != len(aliases):
        raise ValueError(f"got {len(retrieved_texts)} retrieval lists but {len(aliases)} alias lists")
    if not retrieved_texts:
        return 0.0
    hits = sum(
        any(contains_alias(text, gold) for text in (texts if k is None else texts[:k]))
        for texts, gold in zip(retrieved_texts, aliases)
    )
    return hits / len(retrieved_texts)
