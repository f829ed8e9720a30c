"""DVD (Jin et al., EMNLP 2024, "DVD: Dynamic Contrastive Decoding for Knowledge Amplification in
Multi-Document Question Answering"): CAD between the all-documents and the closed-book paths, plus a
contrast between the most and the least useful single document.

Reference: JulieJin-km/Dynamic_Contrastive_Decoding, `DvD.py`, `mode_generate` with `--mode dvd`. One batch
holds the closed-book prompt (row 0), the prompt with all documents (row 1) and one prompt per document
(rows 2..n-1); per step, on each row's last-position logits z:

1. l = z − logsumexp(z) (log-probs), then `TopPLogitsWarper(min(0.95, top_p))` on every row (top_p defaults
   to 1, so p = 0.95): tokens outside the nucleus get -inf (no renormalisation).
2. Per row: H_k = −Σ_{i ∈ top-k} exp(l_i)·clip(l_i, −100, 0) over the k = 10 most likely tokens (a top-k
   entropy on the unrenormalised log-probs; tokens outside the nucleus add 0), and
   Δ = p̃₁ − p̃₂, the gap between the two largest probabilities of p̃ = softmax(l / τ), τ = 1 (renormalised
   over the nucleus).
3. Document selection over the per-document rows: by entropy (default), d⁺ = argmin H_k ("logits_max",
   the most confident document) and d⁻ = argmax H_k ("logits_min"), first index on ties; with
   `--retrieval`, d⁺ = the first document and d⁻ = the last one (retrieval order).
4. Weights: static β = 0.25, γ = 0.2 (the CLI defaults); with `--dynamic_weight`,
   γ = max(Δ(d⁺) − Δ(d⁻), 0) and β = max(Δ(full) − Δ(closed), 0), every step.
5. If H_k(closed)·10 < H_k(full) (the closed-book path is far more certain than the full one):
   static:  l_full + γ·l_d⁺ − γ·l_d⁻;   dynamic: l_closed + γ·l_d⁺ − γ·l_d⁻  (the reference's own asymmetry);
   either way l_full where l_d⁻ ≤ −100 (outside d⁻'s nucleus).
   Otherwise (both): (1 + β)·l_full − β·l_closed + γ·l_d⁺ − γ·l_d⁻, taking l_full where l_closed ≤ −100 or
   l_d⁻ ≤ −100.
6. The token is sampled from softmax(final / τ); where that is NaN (a 0·(−inf) in step 5, e.g. γ = 0 at a
   token outside d⁺'s nucleus, or a row with no finite entry), from softmax(l_full / τ) instead. Decoding
   stops at EOS or a "\\n" token, after at most 300 tokens.

The README's full method is "DvD - Dynamic Weight" (entropy selection, dynamic weights); "Static Weight"
and "Retrieval as selection criteria" are its variants. This module computes steps 1-5 exactly, per row,
with every constant an option (defaults: dynamic weights, entropy selection, k = 10, p = 0.95, ratio 10;
static weights β = 0.25, γ = 0.2), and step 6's NaN fallback as: such a row's scores are l_full.

Deviations, and why:

- Prompts: the closed-book path is our no-context prompt (the reference uses "Question: {q}\\nAnswer:"),
  the full path our context prompt and each document path our context template over that document alone,
  numbered [1] (the reference keeps the document's number in the full list and adds its title). Every path
  is encoded with its own position ids; the reference left-pads one batch without position ids, so its
  shorter prompts run at shifted positions.
- τ = 1 in the statistics of step 2 (the reference default); the decoder's temperature, top-k/top-p and
  greedy or sampled choice apply to the returned scores like for any rule. The reference always samples
  (at τ = 1); here greedy is the default, so pass do_sample=True to match it.
- Per-row float32 (or the caller's dtype) arithmetic instead of the reference's float16 model outputs;
  k is capped at the vocabulary size.
- A question with fewer than 2 documents is refused (the decoder checks before decoding; with one
  document d⁺ = d⁻ and the document term is void). With no documents the decoder falls back to 'standard'
  on the question alone, as for every method (the reference's `doc_num == 0` also decodes closed-book).
- It records `beta` (β where the CAD term is applied: 0 in the closed-book-confident branch and on
  fallback rows) and `gamma` (γ, 0 on fallback rows).
- Fewer than 2 documents is refused by the decoder before decoding, not in `combine` (which must not
  synchronise with the host).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fides_rag.rules.base import CONTEXT, DOCUMENTS, NO_CONTEXT, ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method

SELECTIONS = ("entropy", "retrieval")
FILTERED = -100.0
"""Log-probabilities at or below this count as outside the nucleus (the reference's `> -100` guards)."""
STATIC_BETA, STATIC_GAMMA = 0.25, 0.2


def nucleus_log_probs(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """log_softmax, then -inf outside the top-p nucleus (transformers' TopPLogitsWarper, not renormalised).  [..., V]"""
    from transformers import TopPLogitsWarper  # here, not at the top: the rules load without transformers

    log_probs = torch.log_softmax(logits, dim=-1)
    flat = log_probs.reshape(-1, log_probs.shape[-1])
    return TopPLogitsWarper(top_p)(None, flat).reshape(log_probs.shape)


def top_k_entropy(log_probs: torch.Tensor, k: int) -> torch.Tensor:
    """−Σ p·clip(log p, −100, 0) over the k largest log-probs (filtered tokens add 0).  [..., V] -> [...]"""
    top = torch.topk(log_probs, min(k, log_probs.shape[-1]), dim=-1).values
    return -(top.exp() * top.clamp(FILTERED, 0.0)).sum(dim=-1)


def top_two_gap(log_probs: torch.Tensor) -> torch.Tensor:
    """p̃₁ − p̃₂ of softmax(log_probs), renormalised over the unfiltered tokens.  [..., V] -> [...]"""
    top = torch.topk(torch.softmax(log_probs, dim=-1), 2, dim=-1).values
    return top[..., 0] - top[..., 1]


def _number(value: Any, name: str, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ValueError(f"dvd: {name} must be a finite number >= {low}, got {value!r}")
    return float(value)


@register_method("dvd")
class DvdRule(ContrastRule):
    """(1+β)·l_full − β·l_closed + γ·(l_d⁺ − l_d⁻) on nucleus log-probs; d⁺/d⁻: lowest/highest-entropy document.

    >>> rule = DvdRule(dynamic_weight=False, beta=0.25, gamma=0.2)
    """

    paths = (CONTEXT, NO_CONTEXT, DOCUMENTS)

    def __init__(
        self,
        dynamic_weight: bool = True,
        beta: float | None = None,
        gamma: float | None = None,
        selection: str = "entropy",
        top_k: int = 10,
        top_p: float = 0.95,
        entropy_ratio: float = 10.0,
    ) -> None:
        if not isinstance(dynamic_weight, bool):
            raise ValueError(f"dvd: dynamic_weight must be True or False, got {dynamic_weight!r}")
        if dynamic_weight and (beta is not None or gamma is not None):
            raise ValueError(
                "dvd: beta and gamma are the fixed weights of dynamic_weight=False; with dynamic weights they are "
                "computed at every step, so leave them unset"
            )
        if selection not in SELECTIONS:
            raise ValueError(f"dvd: selection must be one of {SELECTIONS}, got {selection!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"dvd: top_k must be an integer >= 1, got {top_k!r}")
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise ValueError(f"dvd: top_p must lie in (0, 1], got {top_p!r}")
        self.dynamic_weight = dynamic_weight
        self.beta = None if dynamic_weight else _number(STATIC_BETA if beta is None else beta, "beta")
        self.gamma = None if dynamic_weight else _number(STATIC_GAMMA if gamma is None else gamma, "gamma")
        self.selection = selection
        self.top_k = top_k
        self.top_p = float(top_p)
        self.entropy_ratio = _number(entropy_ratio, "entropy_ratio")

    def combine(self, step: StepInputs) -> StepOutput:
        if step.no_ctx_logits is None or step.document_logits is None or step.document_mask is None:
            raise ValueError("dvd: combine needs the no-context logits and the per-document logits and mask")
        present = step.document_mask  # [B, N]; the decoder refused < 2 documents before decoding
        counts = present.sum(dim=-1)  # [B]
        full = nucleus_log_probs(step.ctx_logits, self.top_p)  # [B, V]
        closed = nucleus_log_probs(step.no_ctx_logits, self.top_p)  # [B, V]
        docs = nucleus_log_probs(step.document_logits, self.top_p)  # [B, N, V]
        rows = torch.arange(full.shape[0], device=full.device)
        if self.selection == "entropy":
            entropy = top_k_entropy(docs, self.top_k)  # [B, N]
            best = entropy.masked_fill(~present, math.inf).argmin(dim=-1)  # first minimum
            worst = entropy.masked_fill(~present, -math.inf).argmax(dim=-1)  # first maximum
        else:
            best, worst = torch.zeros_like(counts), counts - 1
        amplify, suppress = docs[rows, best], docs[rows, worst]  # [B, V]

        if self.dynamic_weight:
            gamma = (top_two_gap(amplify) - top_two_gap(suppress)).clamp_min(0.0)  # [B]
            beta = (top_two_gap(full) - top_two_gap(closed)).clamp_min(0.0)  # [B]
            base = closed  # the reference's dynamic branch starts from the closed-book path
        elif self.beta is None or self.gamma is None:
            raise ValueError("dvd: dynamic_weight=False decodes with the fixed weights beta and gamma, which are unset")
        else:
            gamma = full.new_full(rows.shape, self.gamma)
            beta = full.new_full(rows.shape, self.beta)
            base = full
        g, b = gamma[:, None], beta[:, None]
        closed_confident = top_k_entropy(closed, self.top_k) * self.entropy_ratio < top_k_entropy(
            full, self.top_k
        )  # [B]
        keep_suppress = suppress > FILTERED
        confident = torch.where(keep_suppress, base + g * amplify - g * suppress, full)
        contrast = (1 + b) * full - b * closed + g * amplify - g * suppress
        contrast = torch.where(closed > FILTERED, contrast, full)
        contrast = torch.where(keep_suppress, contrast, full)
        final = torch.where(closed_confident[:, None], confident, contrast)
        # The reference samples from softmax(final); where that is NaN it samples from softmax(l_full).
        fallback = torch.isnan(final).any(dim=-1) | ~(final > -math.inf).any(dim=-1)  # [B]
        final = torch.where(fallback[:, None], full, final)
        zero = torch.zeros_like(beta)
        return StepOutput(
            logits=final,
            records={
                "beta": torch.where(closed_confident | fallback, zero, beta),
                "gamma": torch.where(fallback, zero, gamma),
            },
        )

    def options(self) -> dict[str, Any]:
        return {
            "dynamic_weight": self.dynamic_weight,
            "beta": self.beta,
            "gamma": self.gamma,
            "selection": self.selection,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "entropy_ratio": self.entropy_ratio,
        }
