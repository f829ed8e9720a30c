"""Context-aware decoding (Shi et al. 2023; xhan77/context-aware-decoding) with a fixed alpha."""

from __future__ import annotations

import math

import torch

from fides_rag.method.signals import contrast_logits, opposition
from fides_rag.rules.base import ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method


@register_method("cad")
class CadRule(ContrastRule):
    """z_final = (1 + a)·z_ctx − a·z_noctx on raw logits, fixed a (1.0 is the official NQ-Swap setting).

    >>> rule = CadRule(alpha=0.5)
    """

    def __init__(self, alpha: float = 1.0) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 0:
            raise ValueError(f"cad: alpha must be a finite number >= 0, got {alpha!r}")
        self.alpha = float(alpha)

    def combine(self, step: StepInputs) -> StepOutput:
        no_ctx = step.require("no_ctx_logits")
        alpha = torch.full(
            (step.ctx_logits.shape[0],), self.alpha, dtype=step.ctx_logits.dtype, device=step.ctx_logits.device
        )
        return StepOutput(
            logits=contrast_logits(step.ctx_logits, no_ctx, alpha),
            records={"alpha": alpha, "opposition": opposition(step.ctx_logits, no_ctx)},
        )

    def options(self) -> dict:
        return {"alpha": self.alpha}
