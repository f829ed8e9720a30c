"""FIDES's three per-token signals and the contrast rule, as pure tensor functions.

Every function takes a batch of B rows and returns one value per row. Logits are raw
(pre-softmax) scores; all logs are natural.
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)


def kl_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(softmax(logits_p) || softmax(logits_q)) per row.  [B, V], [B, V] -> [B]"""
    log_p = torch.log_softmax(logits_p, dim=-1)
    log_q = torch.log_softmax(logits_q, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(dim=-1)
    return kl.clamp_min(0.0)


def jensen_shannon_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """JSD(P || Q) = ½KL(P||M) + ½KL(Q||M), M = (P+Q)/2, per row, in [0, ln 2].  [B, V] -> [B]"""
    log_p = torch.log_softmax(logits_p, dim=-1)
    log_q = torch.log_softmax(logits_q, dim=-1)
    log_m = torch.logaddexp(log_p, log_q) - LN2
    p, q = log_p.exp(), log_q.exp()
    jsd = 0.5 * (p * (log_p - log_m)).sum(dim=-1) + 0.5 * (q * (log_q - log_m)).sum(dim=-1)
    return jsd.clamp(0.0, LN2)


def opposition(ctx_logits: torch.Tensor, no_ctx_logits: torch.Tensor) -> torch.Tensor:
    """Output-distribution divergence between the two paths: JSD(p_ctx || p_noctx).  [B, V] -> [B]"""
    return jensen_shannon_divergence(ctx_logits, no_ctx_logits)


def hidden_state_shift(ctx_hidden: torch.Tensor, no_ctx_hidden: torch.Tensor, scale: float = 10.0) -> torch.Tensor:
    """clip( (1/(scale·L)) Σ_l ||ĥ_ctx[l] − ĥ_noctx[l]||₂, 0, 1 ), ĥ the L2-normalised state.

    ctx_hidden, no_ctx_hidden: [L, B, H], the last-position output of each transformer block
    (embedding output excluded).  -> [B]
    """
    return (layer_mean_unit_distance(ctx_hidden, no_ctx_hidden) / scale).clamp(0.0, 1.0)


def layer_mean_unit_distance(ctx_hidden: torch.Tensor, no_ctx_hidden: torch.Tensor) -> torch.Tensor:
    """(1/L) Σ_l ||ĥ_ctx[l] − ĥ_noctx[l]||₂ in [0, 2]: the raw Shift, before FIDES's 1/scale and clip
    (used to calibrate `shift_scale`).  [L, B, H], [L, B, H] -> [B]"""
    ctx_unit = torch.nn.functional.normalize(ctx_hidden, p=2.0, dim=-1)
    no_ctx_unit = torch.nn.functional.normalize(no_ctx_hidden, p=2.0, dim=-1)
    return torch.linalg.vector_norm(ctx_unit - no_ctx_unit, ord=2, dim=-1).mean(dim=0)  # [L, B] -> [B]


def logit_lens_noise(mid_lens_logits: torch.Tensor, final_logits: torch.Tensor, scale: float = 5.0) -> torch.Tensor:
    """clip( KL(p̃_mid || p̃_L) / scale, 0, 1 ) on the context path: how unsettled the prediction still is
    between the middle layer's logit lens and the model's own output.  [B, V], [B, V] -> [B]"""
    return (kl_divergence(mid_lens_logits, final_logits) / scale).clamp(0.0, 1.0)


def fused_score(
    opposition_value: torch.Tensor | None,
    shift_value: torch.Tensor | None,
    noise_value: torch.Tensor | None,
    weights: tuple[float, float, float],
) -> torch.Tensor:
    """FScore = w_o·Opposition + w_s·Shift + w_n·Noise; a signal with zero weight may be None.  -> [B]"""
    total: torch.Tensor | None = None
    for value, weight in zip((opposition_value, shift_value, noise_value), weights):
        if weight == 0:
            continue
        if value is None:
            raise ValueError("a signal with a non-zero weight was not computed")
        term = weight * value
        total = term if total is None else total + term
    if total is None:
        raise ValueError("all fusion weights are zero")
    return total


def adaptive_alpha(score: torch.Tensor, lambda_: float = 1.5, alpha_min: float = 0.1) -> torch.Tensor:
    """a_t = max(alpha_min, λ · FScore_t).  [B] -> [B]"""
    return (lambda_ * score).clamp_min(alpha_min)


def contrast_logits(ctx_logits: torch.Tensor, no_ctx_logits: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """The CAD rule on raw logits: (1 + a)·z_ctx − a·z_noctx, with a per row.  [B, V] -> [B, V]"""
    if isinstance(alpha, torch.Tensor):
        alpha = alpha.to(ctx_logits.dtype).unsqueeze(-1)
    return (1.0 + alpha) * ctx_logits - alpha * no_ctx_logits


# -- what the gates read (GRD's agreement test, NWCAD's two stages) -------------------------------------------


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(softmax(z)) = −Σ p log p per row, in nats.  [B, V] -> [B]"""
    log_p = torch.log_softmax(logits, dim=-1)
    return (-(log_p.exp() * log_p).sum(dim=-1)).clamp_min(0.0)


def top_probability(logits: torch.Tensor) -> torch.Tensor:
    """The largest probability of softmax(z) per row.  [B, V] -> [B]"""
    return torch.softmax(logits, dim=-1).amax(dim=-1)


def top_two_margin(logits: torch.Tensor) -> torch.Tensor:
    """p₁ − p₂, the top-1 minus the top-2 probability of softmax(z), per row, in [0, 1].  [B, V] -> [B]"""
    top = torch.softmax(logits, dim=-1).topk(2, dim=-1).values  # [B, 2]
    return top[:, 0] - top[:, 1]


def top_k_jensen_shannon(logits_p: torch.Tensor, logits_q: torch.Tensor, k: int = 50) -> torch.Tensor:
    """JSD in nats between P and Q restricted to the union S of their top-k tokens, each renormalised over S.

    [B, V], [B, V] -> [B], in [0, ln 2]. With k >= V it equals `jensen_shannon_divergence`."""
    k = min(k, logits_p.shape[-1])
    support = torch.zeros_like(logits_p, dtype=torch.bool)
    support.scatter_(-1, logits_p.topk(k, dim=-1).indices, True)
    support.scatter_(-1, logits_q.topk(k, dim=-1).indices, True)
    outside = torch.finfo(logits_p.dtype).min
    return jensen_shannon_divergence(logits_p.masked_fill(~support, outside), logits_q.masked_fill(~support, outside))
