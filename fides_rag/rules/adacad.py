"""AdaCAD (Wang et al. 2024; HanNight/AdaCAD): CAD with a per-token alpha equal to the paths' JSD."""

from __future__ import annotations

import math

from fides_rag.method.signals import contrast_logits, opposition
from fides_rag.rules.base import ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method


@register_method("adacad")
class AdaCadRule(ContrastRule):
    """a_t = max(floor, JSD(p_ctx, p_noctx)) on raw, unfiltered logits; floor 0 for QA, 0.3 for long-form."""

    def __init__(self, floor: float = 0.0) -> None:
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor) or floor < 0:
            raise ValueError(f"adacad: floor must be a finite number >= 0, got {floor!r}")
        self.floor = float(floor)

    def combine(self, step: StepInputs) -> StepOutput:
        no_ctx = step.require("no_ctx_logits")
        jsd = opposition(step.ctx_logits, no_ctx)
        alpha = jsd.clamp_min(self.floor)
        return StepOutput(
            logits=contrast_logits(step.ctx_logits, no_ctx, alpha),
            records={"alpha": alpha, "opposition": jsd},
        )

    def options(self) -> dict:
        return {"floor": self.floor}
