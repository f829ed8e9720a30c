"""NWCAD's two-stage gate (No-Worse Context-Aware Decoding, arXiv 2604.16686): back off to the no-context path
where the context adds nothing, keep the context path where it is sure, contrast only where neither holds."""

from __future__ import annotations

import torch

from fides_rag.method.signals import top_k_jensen_shannon, top_two_margin
from fides_rag.rules.base import StepInputs
from fides_rag.rules.gates.base import (
    CONTEXT_AS_IS,
    NO_CONTEXT_AS_IS,
    RULE,
    Gate,
    GateDecision,
    checked_fraction,
    register_gate,
)


@register_gate("nwcad")
class NwcadGate(Gate):
    """Per token (stateless):

    1. JSD over the union of both paths' top-`top_k` tokens ≤ `tau` (nats) and the no-context margin p₁ − p₂ ≥
       `kappa_prior`: the no-context path's logits (the context is neutral here);
    2. else, the context margin ≥ `kappa_context`: the context path's logits;
    3. else the contrast rule (the paper's fallback is CoCoA; any rule composes).

    Defaults are the authors' (τ 0.30, κ_pri 0.30, κ_ctx 0.05, K 50), tuned on Llama-3.1-8B.

    >>> get_method("fides+nwcad")
    >>> get_method("cocoa", gate=NwcadGate(tau=0.2))
    """

    def __init__(
        self, tau: float = 0.30, kappa_prior: float = 0.30, kappa_context: float = 0.05, top_k: int = 50
    ) -> None:
        self.tau = checked_fraction("nwcad", "tau", tau, high=0.6931471805599453)
        self.kappa_prior = checked_fraction("nwcad", "kappa_prior", kappa_prior)
        self.kappa_context = checked_fraction("nwcad", "kappa_context", kappa_context)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 2:
            raise ValueError(f"nwcad: top_k must be an integer >= 2, got {top_k!r}")
        self.top_k = top_k

    def decide(self, step: StepInputs) -> GateDecision:
        ctx, prior = step.ctx_logits, step.require("no_ctx_logits")  # [B, V] each
        neutral = (top_k_jensen_shannon(ctx, prior, self.top_k) <= self.tau) & (
            top_two_margin(prior) >= self.kappa_prior
        )
        sure = top_two_margin(ctx) >= self.kappa_context
        choice = torch.where(neutral, NO_CONTEXT_AS_IS, torch.where(sure, CONTEXT_AS_IS, RULE))  # [B]
        return GateDecision(choice, torch.where(neutral[:, None], prior, ctx))

    def options(self) -> dict:
        return {
            "tau": self.tau,
            "kappa_prior": self.kappa_prior,
            "kappa_context": self.kappa_context,
            "top_k": self.top_k,
        }
