"""CoCoA (Khandelwal et al. 2025, "Confidence- and Context-Aware Adaptive Decoding for Resolving Knowledge
Conflicts in Large Language Models"; infusion-zero-edit/CoCoA).

Reference: infusion-zero-edit/CoCoA `group_decode_fileio_CoCoA.py`, function `decode` (the newest stored
revision, where `global_alpha = 0.5  #comment this if global_alpha needs to be tunable` and the entropy-gap
booster is commented out; an earlier revision had the booster on with kappa_H2 = 0.5 and `1*Delta` for
`gamma*Delta`). Two processes hold the context and no-context rows; per step, with raw last-position
logits, lc = log_softmax(z_ctx), lp = log_softmax(z_noctx):

1. ΔH = H(p_noctx) − H(p_ctx); D2 = 1 − Σ p_noctx / p_ctx; D2n = clamp(D2 / (1 + D2), 0, 1);
   global_alpha = clamp(sigmoid(γ·ΔH + γ·D2n), 0.1, 0.9) -- and then **overwritten by the constant 0.5**.
2. Δ = lc − lp; S = a·lc + (1 − a)·lp + γ·Δ  (γ = `dsab_gamma` = 1).  The local gate / adaptive τ /
   context-frequency terms are computed but only appear in a commented-out line, so they have no effect.
   S += log(hist_pen), but `hist_counts` and `gen_len` are never updated, so hist_pen = 1 and this is 0.
   (Booster, commented out: S += κ_H2·clamp(H2/(1+H2), 0, 1)·Δ, H2 = 1 − Σ softmax(S)².)
3. Peak amplifier: S += λ_pm·clamp((S − median S) / (MAD S + 1e-8), −100, 100), λ_pm = 100
   (`torch.median`: the lower median).
4. Safeguards: ε = clamp(ε0·exp(−κ_s·ΔH), 0, ε_max) (0.05, 1, 0.2); p = (1 − ε)·softmax(S) + ε/V;
   S_final = log(p + 1e-12) / (1 + 2λ2) (λ2 = 0.1); S_reg = max(S_final, log κ_min) (κ_min = 1e-4).
5. EOS lock while gen_len < 5 (always, since gen_len stays 0), an all-reduce that sums S_reg over the two
   processes, and a top-p "sampling projection" (`projection_top_p`) that picks the token.

With a = 0.5 and γ = 1, step 2 is exactly S = 1.5·lc − 0.5·lp, and steps 3-4 are strictly increasing in S
per row (up to float rounding of near-ties and the κ_min floor on a near-uniform row), so greedy CoCoA
picks argmax(1.5·log p_ctx − 0.5·log p_noctx).

This module computes steps 1-4 exactly (per row), with every constant an option defaulting to the shipped
value; `alpha="adaptive"` uses the computed global_alpha the reference overwrites (a non-finite D2n, from
p_ctx underflowing to 0, is taken as its limit 1 instead of NaN). Deviations: the unused/no-op terms of
step 2 are left out; step 5 is not reproduced (no EOS lock, no doubling by the all-reduce, no projection):
the returned S_reg are scores that the decoder argmaxes or samples like any rule's. It records
`alpha` (the global blend a), `entropy_gap` (ΔH) and `opposition` (JSD(p_ctx, p_noctx)).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fides_rag.method.signals import opposition
from fides_rag.rules.base import ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method

SHIPPED = {
    "alpha": 0.5,
    "gamma": 1.0,
    "kappa_h2": 0.0,
    "lambda_pm": 100.0,
    "eps0": 0.05,
    "kappa_s": 1.0,
    "eps_max": 0.2,
    "lambda2": 0.1,
    "kappa_min": 1e-4,
}


def _median_abs_dev(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower median, lower-median absolute deviation + 1e-8) per row.  [B, V] -> [B, 1], [B, 1]"""
    median = torch.median(x, dim=-1, keepdim=True).values
    mad = torch.median((x - median).abs(), dim=-1, keepdim=True).values + 1e-8
    return median, mad


def cocoa_global_alpha(p_ctx: torch.Tensor, p_no: torch.Tensor, delta_h: torch.Tensor, gamma: float) -> torch.Tensor:
    """The reference's (overwritten) adaptive blend: clamp(sigmoid(γ·ΔH + γ·D2n), 0.1, 0.9).  -> [B, 1]"""
    d2 = 1.0 - (p_no * p_ctx.pow(-1.0)).sum(dim=-1, keepdim=True)  # [B, 1]
    d2n = torch.nan_to_num(d2 / (1.0 + d2), nan=1.0, posinf=1.0, neginf=0.0).clamp(0.0, 1.0)
    return torch.sigmoid(gamma * delta_h + gamma * d2n).clamp(0.1, 0.9)


@register_method("cocoa")
class CocoaRule(ContrastRule):
    """S = a·lc + (1−a)·lp + γ·(lc − lp), peak-amplified and smoothed; shipped a = 0.5, γ = 1: 1.5·lc − 0.5·lp."""

    def __init__(
        self,
        alpha: float | str = 0.5,
        gamma: float = 1.0,
        kappa_h2: float = 0.0,
        lambda_pm: float = 100.0,
        eps0: float = 0.05,
        kappa_s: float = 1.0,
        eps_max: float = 0.2,
        lambda2: float = 0.1,
        kappa_min: float = 1e-4,
    ) -> None:
        if isinstance(alpha, str):
            if alpha != "adaptive":
                raise ValueError(f"cocoa: alpha must be a number in [0, 1] or 'adaptive', got {alpha!r}")
        elif (
            isinstance(alpha, bool)
            or not isinstance(alpha, (int, float))
            or not math.isfinite(alpha)
            or not 0 <= alpha <= 1
        ):
            raise ValueError(f"cocoa: alpha must be a number in [0, 1] or 'adaptive', got {alpha!r}")
        values = {
            "gamma": gamma,
            "kappa_h2": kappa_h2,
            "lambda_pm": lambda_pm,
            "eps0": eps0,
            "kappa_s": kappa_s,
            "eps_max": eps_max,
            "lambda2": lambda2,
            "kappa_min": kappa_min,
        }
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"cocoa: {name} must be a finite number >= 0, got {value!r}")
        if eps_max > 1:
            raise ValueError(f"cocoa: eps_max must be in [0, 1], got {eps_max!r}")
        if kappa_min > 1:
            raise ValueError(f"cocoa: kappa_min must be in [0, 1], got {kappa_min!r}")
        self.alpha = alpha if isinstance(alpha, str) else float(alpha)
        self.gamma = float(gamma)
        self.kappa_h2 = float(kappa_h2)
        self.lambda_pm = float(lambda_pm)
        self.eps0 = float(eps0)
        self.kappa_s = float(kappa_s)
        self.eps_max = float(eps_max)
        self.lambda2 = float(lambda2)
        self.kappa_min = float(kappa_min)

    def combine(self, step: StepInputs) -> StepOutput:
        log_ctx = torch.log_softmax(step.ctx_logits, dim=-1)  # [B, V]
        no_ctx = step.require("no_ctx_logits")
        log_no = torch.log_softmax(no_ctx, dim=-1)  # [B, V]
        p_ctx, p_no = log_ctx.exp(), log_no.exp()
        delta_h = (-(p_no * log_no).sum(-1, keepdim=True)) - (-(p_ctx * log_ctx).sum(-1, keepdim=True))  # [B, 1]
        if self.alpha == "adaptive":
            alpha = cocoa_global_alpha(p_ctx, p_no, delta_h, self.gamma)  # [B, 1]
        else:
            alpha = torch.full_like(delta_h, float(self.alpha))
        delta = log_ctx - log_no  # [B, V]
        mixed = alpha * log_ctx + (1 - alpha) * log_no + self.gamma * delta  # [B, V]
        if self.kappa_h2 > 0:  # entropy-gap booster (commented out in the shipped code)
            h2 = 1.0 - (torch.softmax(mixed, dim=-1) ** 2).sum(-1, keepdim=True)
            mixed = mixed + self.kappa_h2 * (h2 / (1.0 + h2)).clamp(0.0, 1.0) * delta
        if self.lambda_pm > 0:  # margin z-score peak amplifier
            median, mad = _median_abs_dev(mixed)
            mixed = mixed + self.lambda_pm * ((mixed - median) / mad).clamp(-100.0, 100.0)
        vocab = mixed.shape[-1]
        eps = (self.eps0 * torch.exp(-self.kappa_s * delta_h)).clamp(0.0, self.eps_max)  # [B, 1]
        blend = (1 - eps) * torch.softmax(mixed, dim=-1) + eps / vocab  # [B, V]
        final = torch.log(blend + 1e-12) / (1.0 + 2.0 * self.lambda2)
        floor = math.log(self.kappa_min) if self.kappa_min > 0 else float("-inf")
        scores = final.clamp_min(floor)  # [B, V]
        return StepOutput(
            logits=scores,
            records={
                "alpha": alpha.squeeze(-1),
                "opposition": opposition(step.ctx_logits, no_ctx),
                "entropy_gap": delta_h.squeeze(-1),
            },
        )

    def options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SHIPPED}
