"""`fides-stop`: FIDES that never overrides the context path's end of the answer (an extension, not the source's
method)."""

from __future__ import annotations

import torch

from fides_rag.rules.base import StepInputs, StepOutput
from fides_rag.rules.fides import FidesRule
from fides_rag.rules.registry import register_method


@register_method("fides-stop")
class FidesStopRule(FidesRule):
    """FIDES, except at a step where the context path's top token ends the answer: there the final logits are the
    context path's own, so greedy decoding stops where standard decoding would.

    FIDES's contrast can outweigh an end-of-sequence the context path ranks first, and the answer runs on past the
    right span ("Michael Phelps of Mainz, Germany"). This rule keeps that end; at every other step it is exactly
    FIDES, with FIDES's constants (`FidesConfig`) and records, plus `kept_end` (1 where it kept the context path's
    end, else 0). The end tokens are the request's EOS ids and the tokens holding one of its stop strings (the
    template's newline), `StepInputs.end_tokens`; with none it is FIDES.
    An extension of ours, not the source's method.

    >>> get_method("fides-stop")
    >>> get_method("fides-stop+evidence")                 # behind a gate, like FIDES
    """

    reads_end_tokens = True

    def combine(self, step: StepInputs) -> StepOutput:
        """FIDES's logits and records, with the context path's logits on the rows whose top token ends the answer."""
        fides = super().combine(step)
        ctx_logits = step.ctx_logits  # [B, V]
        if step.end_tokens is None:
            keep_end = torch.zeros(ctx_logits.shape[0], dtype=torch.bool, device=ctx_logits.device)  # [B]
        else:
            keep_end = torch.isin(ctx_logits.argmax(dim=-1), step.end_tokens)  # [B]
        logits = torch.where(keep_end[:, None], ctx_logits.to(fides.logits.dtype), fides.logits)  # [B, V]
        records = {**fides.records, "kept_end": keep_end.to(fides.logits.dtype)}
        return StepOutput(logits=logits, records=records, state=fides.state)
