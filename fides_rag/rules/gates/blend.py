"""A blending gate: where the context path is confident, interpolate between the two paths' distributions (bounded,
as CoCoA's and GRD's interpolation arm) instead of letting the rule extrapolate; elsewhere the rule acts."""

from __future__ import annotations

import math

import torch

from fides_rag.method.signals import top_two_margin
from fides_rag.rules.base import StepInputs
from fides_rag.rules.gates.base import MEMORY_LEANING, RULE, Gate, GateDecision, checked_fraction, register_gate


@register_gate("blend")
class BlendGate(Gate):
    """Per token (stateless):

    - the context margin p₁ − p₂ ≥ `kappa`: log(λ·p_ctx + (1 − λ)·p_noctx) with λ = `context_weight` in [0, 1], a
      mixture of the two distributions that never leaves their range (recorded as the gate's blend, 3);
    - else the contrast rule.

    Extrapolation (CAD, FIDES) has unbounded error where memory is right (GRD's analysis); the mixture is bounded by
    the two paths. λ = 1 takes the context path as it is, λ = 0 the no-context path.

    >>> get_method("fides+blend")
    >>> get_method("fides", gate=BlendGate(context_weight=0.5))
    """

    threshold = "kappa"
    rule_above = False

    def __init__(self, context_weight: float = 0.75, kappa: float = 0.05) -> None:
        self.context_weight = checked_fraction("blend", "context_weight", context_weight)
        self.kappa = checked_fraction("blend", "kappa", kappa)

    def decide(self, step: StepInputs) -> GateDecision:
        ctx, prior = step.ctx_logits, step.no_ctx_logits  # [B, V] each
        if prior is None:
            raise ValueError("blend: the step has no no-context logits to blend with")
        lam = self.context_weight
        weights = [math.log(w) if w > 0 else -math.inf for w in (lam, 1.0 - lam)]
        mixed = torch.logaddexp(ctx.log_softmax(dim=-1) + weights[0], prior.log_softmax(dim=-1) + weights[1])  # [B, V]
        confident = self.statistic(step) >= self.kappa  # [B]
        choice = torch.where(confident, MEMORY_LEANING, RULE)  # [B]
        return GateDecision(choice, mixed)

    def statistic(self, step: StepInputs) -> torch.Tensor:
        """[B] the context path's margin p₁ − p₂: the rule acts below `kappa`."""
        return top_two_margin(step.ctx_logits)

    def options(self) -> dict:
        return {"context_weight": self.context_weight, "kappa": self.kappa}
