"""Choosing each unit's next token from its rule's scores: EOS held back below min_new_tokens (every row at once),
each request's own logits processors (on its own history, as when it decodes alone), the lane's sampling warpers,
then argmax or a seeded draw per unit. Everything stays on the device; the caller moves the ids to the host once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fides_rag.generation.engine.lanes import Lane
from fides_rag.generation.engine.layout import Unit


def history(unit: Unit, device: torch.device, new: torch.Tensor | None = None) -> torch.Tensor:
    """[1, T + t] the unit's context prompt and answer so far (and `new`, [1], appended): what logits processors
    and stopping criteria see."""
    ids = torch.tensor([unit.prompt_ids + unit.generated], dtype=torch.long).to(device, non_blocking=True)
    return ids if new is None else torch.cat([ids, new.reshape(1, 1).to(device)], dim=-1)


def _own(unit: Unit, errors: dict[int, BaseException], i: int, call) -> Any:
    """`call()`, or None with the error kept for unit `i` alone (a user's processor or criteria that raises fails
    only its own request)."""
    try:
        return call()
    except Exception as error:  # handed to that request
        errors.setdefault(i, error)
        return None


def _drawable(scores: torch.Tensor) -> torch.Tensor:
    """[n, V] scores to draw from: a row's +inf entries (infinitely likely) share all its mass, as argmax would pick
    one of them; NaN (reported by the caller, never drawn) counts as 0."""
    infinite = torch.isposinf(scores)
    certain = torch.zeros((), device=scores.device).where(infinite, float("-inf"))
    return certain.where(infinite.any(dim=-1, keepdim=True), scores.masked_fill(scores.isnan(), 0.0))


def hold_eos(scores: torch.Tensor, units: Sequence[Unit]) -> torch.Tensor:
    """[n, V] `scores` with the EOS ids at -inf on the rows of units that have generated fewer tokens than their
    min_new_tokens: transformers' `MinNewTokensLengthLogitsProcessor`, for every row at once."""
    held = [i for i, u in enumerate(units) if u.eos_ids and len(u.generated) < u.min_new_tokens]
    if not held:
        return scores
    vocab = scores.shape[-1]
    eos = sorted({e for i in held for e in units[i].eos_ids if 0 <= e < vocab})
    if not eos:
        return scores
    rows = torch.tensor(held, dtype=torch.long).to(scores.device, non_blocking=True)
    columns = torch.tensor(eos, dtype=torch.long).to(scores.device, non_blocking=True)
    held_scores = scores.clone()
    held_scores[rows[:, None], columns[None, :]] = float("-inf")
    return held_scores


def choose(
    scores: torch.Tensor, lane: Lane, errors: dict[int, BaseException]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chosen token of every unit of `lane` [n] (long), whether its processed scores hold a NaN [n] (bool; the
    caller raises once it is on the host), and the processed scores [n, V]. A unit whose own processors raise gets
    its error in `errors` (its row is then chosen from unprocessed scores and discarded)."""
    units = lane.units
    scores = hold_eos(scores, units)
    if any(u.processors is not None for u in units):
        rows = []
        for i, u in enumerate(units):
            row = scores[i : i + 1]
            if u.processors is not None:
                row = _own(u, errors, i, lambda u=u, i=i: u.processors(history(u, scores.device), scores[i : i + 1]))
                row = scores[i : i + 1] if row is None else row
            rows.append(row)
        scores = torch.cat(rows)
    if lane.warpers:
        scores = lane.warpers(None, scores)  # type: ignore[arg-type]  # row by row: temperature, top-k, top-p read no history
    has_nan = torch.isnan(scores).any(dim=-1)
    if not lane.do_sample:
        return scores.argmax(dim=-1), has_nan, scores
    probs = torch.softmax(_drawable(scores), dim=-1)  # [n, V]
    chosen = []
    for i, unit in enumerate(units):
        if unit.generator is None and unit.seed is not None:
            unit.generator = torch.Generator(device=probs.device).manual_seed(unit.seed)
        chosen.append(
            torch.multinomial(probs[i], 1, generator=unit.generator)
        )  # [1], per unit: reproducible alone or batched
    return torch.cat(chosen), has_nan, scores


def criteria_hits(
    units: Sequence[Unit], chosen: torch.Tensor, scores: torch.Tensor, errors: dict[int, BaseException]
) -> torch.Tensor:
    """[n] whether each unit's stopping criteria (its own, if any) stop it after its chosen token."""
    hits = []
    for i, unit in enumerate(units):
        verdict = None
        if unit.criteria is not None:
            verdict = _own(
                unit,
                errors,
                i,
                lambda unit=unit, i=i: unit.criteria(history(unit, chosen.device, chosen[i]), scores[i : i + 1]),
            )
        if verdict is None:
            hits.append(torch.zeros(1, dtype=torch.bool, device=chosen.device))
        else:
            hits.append(torch.as_tensor(verdict, device=chosen.device).reshape(-1)[:1].bool())
    return torch.cat(hits)
