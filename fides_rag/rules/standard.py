"""Standard RAG: greedy (or sampled) decoding on the context path alone."""

from __future__ import annotations

from fides_rag.rules.base import CONTEXT, ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method


@register_method("standard")
class StandardRule(ContrastRule):
    """z_final = z_ctx. Runs no no-context forward pass at all."""

    paths = (CONTEXT,)
    contrasts = False

    def combine(self, step: StepInputs) -> StepOutput:
        return StepOutput(logits=step.ctx_logits)
