"""The default gate: none. The contrast rule chooses every token, exactly as published."""

from __future__ import annotations

import torch

from fides_rag.rules.base import StepInputs
from fides_rag.rules.gates.base import RULE, Gate, GateDecision, register_gate


@register_gate("none")
class NoGate(Gate):
    """Leaves every token to the rule; `get_method("fides+none")` is plain `fides`."""

    def decide(self, step: StepInputs) -> GateDecision:
        logits = step.ctx_logits
        return GateDecision(torch.full((logits.shape[0],), RULE, dtype=torch.long, device=logits.device), logits)
