"""GRD's gate (arXiv 2606.10298; keith-Jiang/conflict-aware-decoding, methods/grd.py): where both paths' greedy
tokens agree there is nothing to correct; at a sequence's first disagreement it decides once whom to trust."""

from __future__ import annotations

import torch

from fides_rag.method.signals import entropy
from fides_rag.rules.base import StepInputs
from fides_rag.rules.gates.base import (
    CONTEXT_AS_IS,
    MEMORY_LEANING,
    RULE,
    Gate,
    GateDecision,
    checked_fraction,
    register_gate,
)

UNDECIDED, TRUST_CONTEXT, TRUST_MEMORY = 0.0, 1.0, 2.0


@register_gate("agree")
class AgreeGate(Gate):
    """Per token, with a_c = argmax z_ctx and a_p = argmax z_noctx:

    1. a_c == a_p: the context path's logits, uncontrasted (greedy emits the shared token; sampling draws from the
       context path's distribution);
    2. at the sequence's first a_c != a_p, decide once: trust memory if p_noctx(a_p) > `prior_confidence` and
       H(p_noctx) < H(p_ctx) (nats, full vocabulary), else trust the context;
    3. a disagreeing token under a trusted context: the contrast rule;
    4. under trusted memory: GRD's blend τ·log p_ctx + (1−τ)·log p_noctx, τ = (1−λ)·τ*, where
       τ* = m_p / (m_c + m_p) (1 where the sum is ≤ 1e-9) is where the pair (a_c, a_p) would flip,
       m_c = log p_ctx(a_c) − log p_ctx(a_p) and m_p = log p_noctx(a_p) − log p_noctx(a_c).

    GRD itself emits a_c in case 3; composed with a rule, the rule corrects there.

    >>> get_method("fides+agree")
    >>> get_method("cad", gate=AgreeGate(commitment=0.5))
    """

    state_size = 1  # UNDECIDED, TRUST_CONTEXT or TRUST_MEMORY

    def __init__(self, prior_confidence: float = 0.5, commitment: float = 0.75) -> None:
        self.prior_confidence = checked_fraction("agree", "prior_confidence", prior_confidence)
        self.commitment = checked_fraction("agree", "commitment", commitment)

    def decide(self, step: StepInputs) -> GateDecision:
        prior = step.require("no_ctx_logits")  # [B, V]
        log_ctx = torch.log_softmax(step.ctx_logits, dim=-1)  # [B, V]
        log_prior = torch.log_softmax(prior, dim=-1)
        a_c, a_p = log_ctx.argmax(dim=-1, keepdim=True), log_prior.argmax(dim=-1, keepdim=True)  # [B, 1]
        agree = (a_c == a_p).squeeze(-1)  # [B]
        trust = step.state[:, 0] if step.state is not None else torch.zeros_like(agree, dtype=log_ctx.dtype)
        memory_wins = (log_prior.gather(-1, a_p).squeeze(-1).exp() > self.prior_confidence) & (
            entropy(prior) < entropy(step.ctx_logits)
        )
        decided = torch.where(memory_wins, TRUST_MEMORY, TRUST_CONTEXT).to(trust.dtype)
        trust = torch.where((trust == UNDECIDED) & ~agree, decided, trust)  # [B]

        m_c = (log_ctx.gather(-1, a_c) - log_ctx.gather(-1, a_p)).squeeze(-1)
        m_p = (log_prior.gather(-1, a_p) - log_prior.gather(-1, a_c)).squeeze(-1)
        total = m_c + m_p
        flip = torch.where(
            total.abs() <= 1e-9,
            torch.ones_like(total),
            m_p / torch.where(total.abs() <= 1e-9, torch.ones_like(total), total),
        )
        tau = ((1.0 - self.commitment) * flip).unsqueeze(-1)  # [B, 1]
        blend = tau * log_ctx + (1.0 - tau) * log_prior  # [B, V]

        choice = torch.where(agree, CONTEXT_AS_IS, torch.where(trust == TRUST_MEMORY, MEMORY_LEANING, RULE))  # [B]
        logits = torch.where((choice == MEMORY_LEANING)[:, None], blend, step.ctx_logits)
        return GateDecision(choice, logits, state=trust.unsqueeze(-1))

    def options(self) -> dict:
        return {"prior_confidence": self.prior_confidence, "commitment": self.commitment}
