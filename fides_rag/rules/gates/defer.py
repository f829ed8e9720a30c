"""A gate of fides-rag's own, with no constant to tune: where the context path's greedy token already departs from
the no-context path's, the documents have moved the answer and the context path is taken as it is; the contrast rule
acts only where both paths still agree, the one place where memory may be overriding the documents."""

from __future__ import annotations

import torch

from fides_rag.rules.base import StepInputs
from fides_rag.rules.gates.base import CONTEXT_AS_IS, RULE, Gate, GateDecision, register_gate


@register_gate("defer")
class DeferGate(Gate):
    """Per token: argmax z_ctx != argmax z_noctx: the context path's logits (greedy emits standard decoding's token);
    else the contrast rule. The mirror image of `agree`, which contrasts only where the paths disagree.

    >>> get_method("fides+defer")
    """

    def decide(self, step: StepInputs) -> GateDecision:
        ctx = step.ctx_logits  # [B, V]
        departs = ctx.argmax(dim=-1) != step.require("no_ctx_logits").argmax(dim=-1)  # [B]
        return GateDecision(torch.where(departs, CONTEXT_AS_IS, RULE), ctx)
