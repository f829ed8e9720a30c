"""Answer metrics, all on one SQuAD-style normalisation.

Normalisation (`normalize_answer`): lower-case; drop every punctuation character (Python's
`string.punctuation`); drop the articles "a", "an", "the" as whole words; collapse runs of whitespace to one
space and strip the ends. So "The  Eiffel-Tower!" -> "eiffeltower" and "An apple" -> "apple".

Per prediction, with C = the example's context answers (what the passages support) and M = its memory
answers (the original answer that the passage contradicts; present only on conflict-form samples):

- **EM** = 1 if normalize(prediction) == normalize(c) for some c in C, else 0. EM is always taken
  against the *context* answers, on every sample (conflict and non-conflict).
- **F1** = max over c in C of the token F1 between the whitespace tokens of normalize(prediction) and
  of normalize(c) (precision and recall over the multiset of common tokens; 0 when either side is empty
  and they differ, 1 when both are empty).
- **CF** (context fidelity) = EM against C, counted on conflict-form samples only (M non-empty); it is
  undefined (None) on non-conflict samples.
- **Memorised** = 1 if normalize(prediction) == normalize(m) for some m in M (conflict samples only).
  The memorisation ratio is the share of conflict-form predictions that are memorised.
- **Accuracy** = 1 if some non-empty normalize(c), c in C, occurs in normalize(prediction) as a
  contiguous run of whole tokens, else 0 (the PopQA convention "a gold alias appears in the output";
  whole tokens, so the alias "8" does not match "1889" and "pol" does not match "political").
- **Containment** = 1 if some non-empty normalize(c), c in C, occurs in normalize(prediction) as whole tokens and
  the prediction has at most 3 more tokens than that answer, else 0: EM that forgives a few extra words ("Paris,
  France" for "Paris") but not a sentence that merely mentions the answer. A secondary metric beside EM.

Aggregates (`aggregate`) are means over the samples where the metric is defined, in percent.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)

METRICS = ("cf", "em", "containment", "f1", "memorized", "accuracy")
METRIC_LABELS = {"cf": "CF", "em": "EM", "containment": "Cont", "f1": "F1", "memorized": "MemR", "accuracy": "Acc"}
CONTAINMENT_EXTRA_WORDS = 3
"""Containment: how many words a prediction may have beyond the answer it contains."""


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals some normalised answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def _f1(prediction_tokens: list[str], answer_tokens: list[str]) -> float:
    if not prediction_tokens or not answer_tokens:
        return float(prediction_tokens == answer_tokens)
    common = Counter(prediction_tokens) & Counter(answer_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(prediction_tokens), overlap / len(answer_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, answers: Iterable[str]) -> float:
    """Max over answers of the SQuAD token F1 between normalised prediction and answer."""
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(a).split()) for a in answers), default=0.0)


def contains_answer(prediction: str, answers: Iterable[str]) -> float:
    """1.0 if some non-empty normalised answer occurs in the normalised prediction as whole tokens."""
    pred = f" {normalize_answer(prediction)} "
    return float(any((n := normalize_answer(a)) and f" {n} " in pred for a in answers))


def containment(prediction: str, answers: Iterable[str], extra_words: int = CONTAINMENT_EXTRA_WORDS) -> float:
    """1.0 if some non-empty normalised answer occurs in the normalised prediction as whole tokens and the prediction
    has at most `extra_words` tokens more than that answer, else 0.0."""
    pred = normalize_answer(prediction)
    length = len(pred.split())
    padded = f" {pred} "
    return float(
        any(
            (n := normalize_answer(a)) and f" {n} " in padded and length <= len(n.split()) + extra_words
            for a in answers
        )
    )


def score_prediction(
    prediction: str, context_answers: Sequence[str], memory_answers: Sequence[str] = ()
) -> dict[str, float | None]:
    """Every metric of one prediction (see the module docstring); CF and memorised are None without memory answers."""
    em = exact_match(prediction, context_answers)
    conflict = bool(memory_answers)
    return {
        "cf": em if conflict else None,
        "em": em,
        "containment": containment(prediction, context_answers),
        "f1": token_f1(prediction, context_answers),
        "memorized": exact_match(prediction, memory_answers) if conflict else None,
        "accuracy": contains_answer(prediction, context_answers),
    }


# Kept as a loop: a mean over one list per metric; a DataFrame here would add a dependency and nothing else.
def aggregate(scores: Sequence[dict[str, Any]], metrics: Sequence[str] = METRICS) -> dict[str, float | int | None]:
    """Mean of each metric over the samples where it is defined, in percent; `n_<metric>` counts those samples."""
    out: dict[str, float | int | None] = {}
    for name in metrics:
        values = [s[name] for s in scores if s.get(name) is not None]
        out[name] = 100.0 * sum(values) / len(values) if values else None
        out[f"n_{name}"] = len(values)
    return out
