"""A gate that lets the contrast rule act only where the documents move the next token's distribution: where they
barely do, the context path is taken as it is (standard decoding's token), so the contrast cannot amplify small
differences between the paths into a different answer. Its one threshold is fitted per backbone, label-free, by
`fides-rag calibrate --gate evidence`."""

from __future__ import annotations

import math

import torch

from fides_rag.method.signals import jensen_shannon_divergence
from fides_rag.rules.base import StepInputs
from fides_rag.rules.gates.base import CONTEXT_AS_IS, RULE, Gate, GateDecision, checked_fraction, register_gate

HALF_LN2 = math.log(2.0) / 2
"""The default threshold: half of the Jensen-Shannon divergence's range [0, ln 2]."""


@register_gate("evidence")
class EvidenceGate(Gate):
    """Per token (stateless): JSD(p_ctx ‖ p_noctx) ≥ `tau` (nats, in [0, ln 2]): the contrast rule; else the context
    path's logits as they are.

    The default τ, half the divergence's range, is not fitted to any backbone; `fides-rag calibrate --gate evidence
    --target-share S` sets τ so that the rule acts on a share S of the tokens of unlabelled prompts, and writes it to
    the config file (`FidesConfig.gates`).

    >>> get_method("fides+evidence")
    >>> get_method("fides", gate=EvidenceGate(tau=0.2))
    """

    threshold = "tau"
    rule_above = True

    def __init__(self, tau: float = HALF_LN2) -> None:
        self.tau = checked_fraction("evidence", "tau", tau, high=math.log(2.0))

    def statistic(self, step: StepInputs) -> torch.Tensor:
        """[B] JSD(p_ctx ‖ p_noctx) over the whole vocabulary: the rule acts at or above `tau`."""
        if step.no_ctx_logits is None:
            raise ValueError("evidence: the step has no no-context logits to compare with")
        return jensen_shannon_divergence(step.ctx_logits, step.no_ctx_logits)

    def decide(self, step: StepInputs) -> GateDecision:
        moved = self.statistic(step) >= self.tau  # [B]
        return GateDecision(torch.where(moved, RULE, CONTEXT_AS_IS), step.ctx_logits)

    def options(self) -> dict:
        return {"tau": self.tau}
