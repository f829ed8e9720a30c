"""`fides-stop`: FIDES that never overrides the context path's end of the answer (an extension, not the source's
method)."""

from __future__ import annotations

import torch

from fides_rag.rules.base import StepInputs, StepOutput
from fides_rag.rules.fides import FidesRule
from fides_rag.rules.registry import register_method


def ends_answer(token_ids: torch.Tensor, end_token_ids: tuple[int, ...]) -> torch.Tensor:
    """[B] bool, True where `token_ids` [B] is one of `end_token_ids` (all False for none); no host sync."""
    hit = torch.zeros_like(token_ids, dtype=torch.bool)
    for end in end_token_ids:  # a handful of EOS ids, each a scalar compare
        hit = hit | (token_ids == end)
    return hit


@register_method("fides-stop")
class FidesStopRule(FidesRule):
    """FIDES, except at a step where the context path's top token ends the answer: there the final logits are the
    context path's own, so greedy decoding stops where standard decoding would.

    FIDES's contrast can outweigh an end-of-sequence the context path ranks first, and the answer runs on past the
    right span ("Michael Phelps of Mainz, Germany"). This rule keeps that end; at every other step it is exactly
    FIDES, with FIDES's constants (`FidesConfig`) and records, plus `kept_end` (1 where it kept the context path's
    end, else 0). The end tokens are the request's EOS ids (`StepInputs.end_token_ids`); with none it is FIDES.
    An extension of ours, not the source's method.

    >>> get_method("fides-stop")
    >>> get_method("fides-stop+evidence")                 # behind a gate, like FIDES
    """

    def combine(self, step: StepInputs) -> StepOutput:
        """FIDES's logits and records, with the context path's logits on the rows whose top token ends the answer."""
        fides = super().combine(step)
        ctx_logits = step.ctx_logits  # [B, V]
        keep_end = ends_answer(ctx_logits.argmax(dim=-1), step.end_token_ids)  # [B]
        logits = torch.where(keep_end[:, None], ctx_logits.to(fides.logits.dtype), fides.logits)  # [B, V]
        records = {**fides.records, "kept_end": keep_end.to(fides.logits.dtype)}
        return StepOutput(logits=logits, records=records, state=fides.state)
