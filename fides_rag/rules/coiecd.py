"""COIECD (Yuan et al. 2024, "Discerning and Resolving Knowledge Conflicts through Adaptive Decoding with
Contextual Information-Entropy Constraint"; Stacy027/COIECD).

Reference: Stacy027/COIECD `decoding.py`.

- `model_answer`: each step takes the last-position logits of the context row and the no-context row and
  normalises them to log-probs (`logits - logits.logsumexp(-1)`), then calls
  `coiecd_constraint(logits_cond, logits_uncond, beta)` with `beta = 1.0` (the `alpha = 0.1` defined next
  to it is unused) and takes the argmax (greedy; the top-p call is commented out).
- `cal_constraint_bounds(scores=cond, logits=uncond, mass=0.9, threshold_ratio=4)` (`mass` unused):
  ent = H(p_uncond); s = log_softmax(−log p_cond − ent), i.e. s_v = −log p_cond[v] − log Σ_u 1/p_cond[u]
  (the entropy is a per-row constant and cancels). With r = threshold_ratio:
  `mask` (typical) = s ≥ min s + log r  ⇔  p_cond[v] ≤ p_max / r;
  `mask_filter`    = s > max s − log r  ⇔  p_cond[v] < r · p_min  (p_max, p_min of p_cond, this row);
  if exactly one token has s < min s + log r (i.e. only the top token is above p_max / r), every
  token counts as typical.
- `coiecd_constraint(cond, uncond, alpha)`: c = 1; c[typical] = 0; c[mask_filter] = 1;
  merged = c·cond + (1 − c)·uncond + alpha·(cond − uncond).

So, with lc = log p_ctx, lu = log p_noctx, a = alpha, r = threshold_ratio, per token v:

    c_v = 1 if p_ctx[v] < r·p_min, else 0 if (p_ctx[v] ≤ p_max/r or only the top token exceeds p_max/r), else 1
    z_v = c_v·((1 + a)·lc_v − a·lu_v) + (1 − c_v)·(a·lc_v + (1 − a)·lu_v)

With the shipped a = 1 the typical tokens get lc (a·cond + (1 − a)·uncond), the others the CAD rule
2·lc − lu on log-probs. The masks are computed exactly as the reference does (same chain of log_softmax
and comparisons), per row. Deviation: the reference ran one example at a time, and its
"only one token above the threshold" test summed over the whole batch; here it is per row.
It records `alpha` (a) and `opposition` the JSD of the two paths (for comparison with other rules).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fides_rag.method.signals import opposition
from fides_rag.rules.base import ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method


def coiecd_cad_mask(
    ctx_log_probs: torch.Tensor, no_ctx_log_probs: torch.Tensor, threshold_ratio: float = 4.0
) -> torch.Tensor:
    """c: True where a token takes the CAD branch (reference `constraint_list == 1`).  [B, V] -> [B, V] bool"""
    normalized = torch.log_softmax(no_ctx_log_probs, dim=-1)
    ent = -(normalized * normalized.exp()).nansum(-1, keepdim=True)  # [B, 1], H(p_noctx); cancels below
    shifted = torch.log_softmax(-torch.log_softmax(ctx_log_probs, dim=-1) - ent, dim=-1)  # [B, V]
    log_ratio = math.log(threshold_ratio)
    lowest = shifted.min(dim=-1, keepdim=True).values  # the most probable token
    highest = shifted.max(dim=-1, keepdim=True).values  # the least probable token
    typical = shifted >= lowest + log_ratio  # p_ctx <= p_max / r
    below_floor = shifted > highest - log_ratio  # p_ctx < r · p_min
    single = (shifted < lowest + log_ratio).sum(dim=-1, keepdim=True) == 1  # [B, 1]
    typical = typical | single
    return ~typical | below_floor


@register_method("coiecd")
class CoiecdRule(ContrastRule):
    """z = c·((1+a)·lc − a·lu) + (1−c)·(a·lc + (1−a)·lu) on log-probs, c from the entropy constraint on p_ctx."""

    def __init__(self, alpha: float = 1.0, threshold_ratio: float = 4.0) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 0:
            raise ValueError(f"coiecd: alpha must be a finite number >= 0, got {alpha!r}")
        if (
            isinstance(threshold_ratio, bool)
            or not isinstance(threshold_ratio, (int, float))
            or not math.isfinite(threshold_ratio)
            or threshold_ratio < 1
        ):
            raise ValueError(f"coiecd: threshold_ratio must be a finite number >= 1, got {threshold_ratio!r}")
        self.alpha = float(alpha)
        self.threshold_ratio = float(threshold_ratio)

    def combine(self, step: StepInputs) -> StepOutput:
        cond = torch.log_softmax(step.ctx_logits, dim=-1)  # [B, V]
        no_ctx = step.require("no_ctx_logits")
        uncond = torch.log_softmax(no_ctx, dim=-1)  # [B, V]
        cad = coiecd_cad_mask(cond, uncond, self.threshold_ratio).to(cond.dtype)  # [B, V], 1 = CAD branch
        merged = cad * cond + (1 - cad) * uncond + self.alpha * (cond - uncond)
        alpha = torch.full((cond.shape[0],), self.alpha, dtype=cond.dtype, device=cond.device)
        return StepOutput(logits=merged, records={"alpha": alpha, "opposition": opposition(step.ctx_logits, no_ctx)})

    def options(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "threshold_ratio": self.threshold_ratio}
