"""DoLa (Chuang et al. 2023, "DoLa: Decoding by Contrasting Layers"): contrast the final layer with the
most divergent premature layer of the same (context) path.

Reference: transformers 4.4x, `src/transformers/generation/utils.py` (removed in 5.x, now the hub repo
`transformers-community/dola`), read here through copies of that code in the search index:

- `GenerationMixin._dola_decoding`: candidate premature layers, in `outputs.hidden_states` indexing
  (0 = embedding output, i = output of block i, L = final, already final-normed):
  `start_layer` = 0 for untied embeddings, else 2 if L > 2, 1 if L == 2, 0 otherwise;
  "low" = [start_layer] if start_layer == L // 2, else range(start_layer, L // 2, 2) (L <= 40) or
  range(start_layer, 20, 2) (L > 40); "high" = range(L // 2, L, 2) (L <= 40) or range(L - 20, L, 2);
  an explicit list keeps the entries < L. Premature logits are `lm_head(hidden_states[i][:, -1])`;
  the mature logits are the model's own `outputs.logits[:, -1]`.
- `_dola_select_contrast`: with one candidate, use it; otherwise M = ½(p_final + p_prem) and
  js = ½(kl_div(log p_final, M).mean(-1) + kl_div(log p_prem, M).mean(-1)) per layer and row, where
  `F.kl_div(input, target)` is Σ target·(log target − input), so each term is KL(M || ·) averaged (not
  summed) over the vocabulary; then `js.mean(-1)` over the batch and one argmax layer for all rows.
- `_relative_top_filter(final, base, relative_top=0.1, filter_value=-inf, base_filter_value=-1e-3,
  min_tokens_to_keep=1)`: on log-softmaxed scores, thresh = min(k-th largest log p_final,
  max log p_final + log relative_top); tokens with log p_final < thresh get -inf (final) / -1e-3 (base).
  Result = log p_final − log p_base, so filtered tokens are -inf. transformers always used 0.1.

What this module computes, per row b (z_L = ctx_logits, z_l = the lens logits of block l):

    j_l   = ½·mean_v M_l·(log M_l − log p_L) + ½·mean_v M_l·(log M_l − log p_l),  M_l = ½(p_L + p_l)
    l*    = argmax_l j_l  (first on ties; a single candidate is taken as is)
    score = log_softmax(z_L) − log_softmax(z_l*)  where log p_L ≥ thresh, else -inf
    thresh = min(k-th largest log p_L, max log p_L + log relative_top)   (relative_top 0: no filter)

Deviations, and why:

- Layer choice is per row, not one layer per batch (transformers' `js_divs.mean(-1)`): the paper and
  the original DoLa repository decode one example at a time, and per row keeps batch == single.
- Premature logits come from our logit lens, which applies the final norm (and any soft-capping) before
  the head; transformers applied `lm_head` to the raw, un-normed hidden state.
- Buckets: our lens cannot give the embedding output (index 0), so we use transformers' tied-embedding
  branch (start 2 for L > 2, 1 for L == 2), whose buckets never contain index 0. For L > 5 it equals the
  untied branch with index 0 dropped. Where transformers' formula gives no layer at all (L == 3, "low")
  we use block 1. A 1-layer model has no premature block and is refused. Index i ≥ 1 of `hidden_states`
  is the output of block i, so the bucket numbers are our 1-based block indices unchanged.
- An explicit `layers` entry ≥ L is an error here (transformers silently dropped it).
- It records `layer_jsd`: j of the chosen layer (the selection statistic exactly as transformers
  computed it, not the textbook JSD); `alpha` stays None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from fides_rag.rules.base import CONTEXT, ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method

BUCKETS = ("high", "low")
BASE_FILTER_VALUE = -1e-3  # transformers' base_filter_value for filtered tokens of the premature layer


def dola_candidate_layers(num_layers: int, layers: str | Sequence[int] = "high") -> tuple[int, ...]:
    """The premature candidates (1-based blocks, never the embedding output or the final block)."""
    final = num_layers
    if final < 2:
        raise ValueError(
            f"dola: needs a model with at least 2 layers (a premature block below the final one), got {final}"
        )
    if isinstance(layers, str):
        if layers == "high":
            picked: Sequence[int] = range(final // 2, final, 2) if final <= 40 else range(final - 20, final, 2)
        elif layers == "low":
            start = 2 if final > 2 else 1  # transformers' tied-embedding start: skips the embedding output
            if start == final // 2:
                picked = [start]
            else:
                picked = range(start, final // 2, 2) if final <= 40 else range(start, 20, 2)
        else:
            raise ValueError(f"dola: layers must be 'high', 'low' or a list of block indices, got {layers!r}")
        chosen = tuple(i for i in picked if i >= 1)
        return chosen or (1,)
    too_deep = [i for i in layers if i >= final]
    if too_deep:
        raise ValueError(
            f"dola: layers {too_deep} are not premature layers of a {final}-layer model (each must be < {final}; "
            f"block {final} is the mature layer)"
        )
    return tuple(layers)


def dola_divergence(final_logits: torch.Tensor, premature_logits: torch.Tensor) -> torch.Tensor:
    """transformers' layer-selection statistic: ½·mean_v KL-terms of M against both.  [..., V] -> [...]"""
    log_final = torch.log_softmax(final_logits, dim=-1)
    log_prem = torch.log_softmax(premature_logits, dim=-1)
    mix = 0.5 * (log_final.exp() + log_prem.exp())  # M, [..., V]
    kl1 = torch.nn.functional.kl_div(log_final, mix, reduction="none").mean(-1)
    kl2 = torch.nn.functional.kl_div(log_prem, mix, reduction="none").mean(-1)
    return 0.5 * (kl1 + kl2)


def relative_top_contrast(
    final_logits: torch.Tensor, base_logits: torch.Tensor, relative_top: float = 0.1, min_tokens_to_keep: int = 1
) -> torch.Tensor:
    """log p_final − log p_base, -inf where log p_final < min(k-th largest, max + log rt).  [B, V] -> [B, V]"""
    log_final = torch.log_softmax(final_logits, dim=-1)
    log_base = torch.log_softmax(base_logits, dim=-1)
    if relative_top > 0:
        kth = torch.topk(log_final, min_tokens_to_keep, dim=-1).values[..., -1]  # [B]
        thresh = torch.minimum(kth, log_final.max(dim=-1).values + math.log(relative_top)).unsqueeze(-1)  # [B, 1]
        dropped = log_final < thresh  # [B, V]
        log_final = log_final.masked_fill(dropped, float("-inf"))
        log_base = log_base.masked_fill(dropped, BASE_FILTER_VALUE)
    return log_final - log_base


@register_method("dola")
class DolaRule(ContrastRule):
    """score = log p_L − log p_l* on tokens with p_L ≥ rt·max p_L (else -inf), l* = argmax_l JSD(p_L, p_l)."""

    paths = (CONTEXT,)

    def __init__(
        self, layers: str | Sequence[int] = "high", relative_top: float = 0.1, min_tokens_to_keep: int = 1
    ) -> None:
        if isinstance(layers, str):
            if layers not in BUCKETS:
                raise ValueError(f"dola: layers must be 'high', 'low' or a list of block indices, got {layers!r}")
        else:
            if isinstance(layers, (bytes, dict)) or not isinstance(layers, Sequence) or not layers:
                raise ValueError(
                    f"dola: layers must be 'high', 'low' or a non-empty list of block indices, got {layers!r}"
                )
            if any(isinstance(i, bool) or not isinstance(i, int) or i < 1 for i in layers):
                raise ValueError(
                    "dola: layers must be 1-based block indices >= 1 (the embedding output cannot be lensed), got "
                    f"{layers!r}"
                )
            if len(set(layers)) != len(layers):
                raise ValueError(f"dola: layers repeats a block index: {layers!r}")
            layers = tuple(int(i) for i in layers)
        if (
            isinstance(relative_top, bool)
            or not isinstance(relative_top, (int, float))
            or not math.isfinite(relative_top)
            or not 0 <= relative_top <= 1
        ):
            raise ValueError(f"dola: relative_top must be a number in [0, 1], got {relative_top!r}")
        if isinstance(min_tokens_to_keep, bool) or not isinstance(min_tokens_to_keep, int) or min_tokens_to_keep < 1:
            raise ValueError(f"dola: min_tokens_to_keep must be an integer >= 1, got {min_tokens_to_keep!r}")
        self.layers = layers
        self.relative_top = float(relative_top)
        self.min_tokens_to_keep = min_tokens_to_keep

    def lens_layers(self, num_layers: int) -> tuple[int, ...]:
        return dola_candidate_layers(num_layers, self.layers)

    def combine(self, step: StepInputs) -> StepOutput:
        final = step.ctx_logits  # [B, V]
        candidates = self.lens_layers(step.num_layers)
        stacked = torch.stack([step.lens_logits[layer] for layer in candidates])  # [C, B, V]
        divergence = dola_divergence(final.unsqueeze(0), stacked)  # [C, B]
        chosen = divergence.argmax(dim=0)  # [B], first maximum on ties
        rows = torch.arange(final.shape[0], device=final.device)
        base = stacked[chosen, rows]  # [B, V]
        logits = relative_top_contrast(final, base, self.relative_top, min(self.min_tokens_to_keep, final.shape[-1]))
        return StepOutput(logits=logits, records={"layer_jsd": divergence[chosen, rows]})

    def options(self) -> dict[str, Any]:
        layers = self.layers if isinstance(self.layers, str) else list(self.layers)
        return {"layers": layers, "relative_top": self.relative_top, "min_tokens_to_keep": self.min_tokens_to_keep}
