"""Choosing each unit's next token from its rule's scores: user processors and sampling warpers, then argmax
or a seeded draw per unit. Everything stays on the device; the caller moves the ids to the host once."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessorList

from fides_rag.generation.layout import Unit
from fides_rag.generation.settings import GenerationSettings


class NonFiniteLogitsError(ValueError):
    """The model or a rule produced NaN or inf values; decoding cannot continue meaningfully."""


def history(prompt_ids: torch.Tensor, examples: torch.Tensor, units: Sequence[Unit]) -> torch.Tensor:
    """[n, T + t] prompt and generated ids of each unit, what logits processors and stopping criteria see."""
    generated = torch.tensor([u.generated for u in units], dtype=torch.long).reshape(len(units), -1)
    return torch.cat([prompt_ids[examples.to(prompt_ids.device)], generated.to(prompt_ids.device)], dim=-1)


def choose(
    scores: torch.Tensor, units: Sequence[Unit], settings: GenerationSettings, processors: LogitsProcessorList, ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chosen token of every unit [n] (long), whether the processed scores hold a NaN (0-dim bool; the
    caller raises once it is on the host), and the processed scores [n, V].

    `ids` [n, T + t] is the history processors see (None when there are none)."""
    if processors:
        scores = processors(ids.to(scores.device), scores)
    has_nan = torch.isnan(scores).any()
    if not settings.do_sample:
        return scores.argmax(dim=-1), has_nan, scores
    probs = torch.softmax(scores.nan_to_num(nan=0.0, posinf=0.0, neginf=float("-inf")), dim=-1)  # [n, V]; NaN is reported, not drawn
    chosen = []
    for i, unit in enumerate(units):
        if unit.generator is None and unit.seed is not None:
            unit.generator = torch.Generator(device=probs.device).manual_seed(unit.seed)
        chosen.append(torch.multinomial(probs[i], 1, generator=unit.generator))  # [1], per unit: reproducible alone or batched
    return torch.cat(chosen), has_nan, scores
