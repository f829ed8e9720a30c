"""DeCoRe (Gema et al. 2024, "DeCoRe: Decoding by Contrasting Retrieval Heads to Mitigate Hallucinations"):
contrast the model with a copy of itself whose retrieval heads are masked, both reading the context.

Reference: aryopg/DeCoRe, read here through its fork awesomealex1/faithful-reasoning (`src/models/
decore_entropy.py`, `decore_vanilla.py`, `src/utils/modelling_llama.py`, `configs/decoder/decore_*.yaml`):

- Heads: the retrieval-head JSON of Wu et al.'s `retrieval_head_detection.py` ("layer-head" -> per-sample
  scores, 0-based layers), sorted by mean score, the first `num_retrieval_heads` kept (config default 50).
- `DeCoReEntropy.generate` (the variant the paper reports, DeCoRe_entropy), greedy, one example at a time:
  z_base and z_masked are the raw next-token logits of the base model and of the model run with
  `block_list=retrieval_heads`;
      alpha = H(softmax(z_base)) = -Σ_v p_v · log(p_v + 1e-12)     (natural log)
      alpha = alpha / log V                if scale_alpha   (default False)
      alpha = min(alpha, alpha_cap)        if alpha_cap     (default None: no cap)
      z     = (1 + alpha) · z_base − alpha · z_masked,  next token = argmax z
  on raw logits: `post_softmax` (default True) and log-softmaxed logits only appear in `lm_score`, the
  likelihood scorer for multiple-choice tasks, not in generation. The recorded `alphas` are taken before the cap.
- `DeCoReVanilla.generate`: the same with a fixed alpha (config default 0.5).

What this module computes, per row b (z_base = ctx_logits, z_masked = masked_logits, both on [d; x; y<t]):

    entropy variant:  a = min(H(softmax(z_base)) [/ log V], alpha_cap)   (H with the reference's 1e-12)
    vanilla variant:  a = alpha
    logits = (1 + a) · z_base − a · z_masked;  StepOutput.alpha = a (after the cap)

`masked_heads` returns the explicit `heads`, or the top `num_heads` of `fides_rag.method.heads.retrieval_head_ranking`,
discovered once per model on synthetic copy prompts and cached. By default `num_heads` keeps the reference's
share of heads, 50 of Llama-3-8B's 1024 (4.9%), rounded up: 14 of SmolLM2-135M's 270, 4 of gemma3-270m's 72.

Deviations, and why:

- How a head is masked (done by the decoder): the decoder zeroes the head's slice of the o_proj input, as the
  paper describes. The reference code's eager path instead overwrites the head's pre-softmax scores (after the
  causal mask was added) with 0, so the head attends uniformly to every cached position and outputs the mean
  of its values; its flash path zeroes the head's query, also uniform attention over the causal keys.
- Which positions are masked (done by the decoder): our masked path is the whole context path [d; x; y<t]
  with the heads masked at every position. The reference runs the prompt (all but its last token) once through
  the *unmasked* model and gives a deep copy of that KV cache to the masked model, so masking acts only from
  the prompt's last token on.
- The heads come from `fides_rag.method.heads` (label-free synthetic copy prompts; see its docstring), not from the
  reference's needle-in-a-haystack JSON files; layers are 1-based here.
- The default head count is the reference's *share* (50 / 1024), not its absolute 50, which was tuned for
  7-8B models and would mask most heads of a small model (50 of gemma3-270m's 72, most of which score 0).
  An explicit `num_heads` is an absolute count, as in the reference.
- `alpha_cap` must be None or > 0: the reference's `if self.alpha_cap:` silently treated 0 as "no cap".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from fides_rag.method.heads import DiscoverySettings, retrieval_heads
from fides_rag.method.lens import ModelAnatomy
from fides_rag.method.signals import contrast_logits
from fides_rag.rules.base import CONTEXT, MASKED_HEADS, ContrastRule, StepInputs, StepOutput
from fides_rag.rules.registry import register_method

VARIANTS = ("entropy", "vanilla")
REFERENCE_NUM_HEADS, REFERENCE_TOTAL_HEADS = 50, 1024  # the reference's num_retrieval_heads, of Llama-3-8B's 32 x 32


def default_num_heads(total_heads: int) -> int:
    """The reference's share of heads (50 of 1024), rounded up, at least 1."""
    return max(1, math.ceil(total_heads * REFERENCE_NUM_HEADS / REFERENCE_TOTAL_HEADS))


DEFAULT_VANILLA_ALPHA = 0.5  # the reference's decore_vanilla.yaml
ENTROPY_EPS = 1e-12  # inside the log, as the reference's _calculate_entropy


def decore_entropy(logits: torch.Tensor, scale: bool = False) -> torch.Tensor:
    """The reference's alpha: -Σ p·log(p + 1e-12) of softmax(logits), divided by log V if `scale`.  [B, V] -> [B]"""
    probs = torch.softmax(logits, dim=-1)
    entropy = -(probs * torch.log(probs + ENTROPY_EPS)).sum(-1)
    if scale:
        entropy = entropy / math.log(logits.shape[-1])
    return entropy


def _normalise_heads(heads: Any) -> dict[int, tuple[int, ...]]:
    if not isinstance(heads, Mapping) or not heads:
        raise ValueError(
            f"decore: heads must be a non-empty mapping {{layer (1-based): [head indices]}} or None, got {heads!r}"
        )
    normalised: dict[int, tuple[int, ...]] = {}
    for key, value in heads.items():
        layer = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 1:
            raise ValueError(f"decore: heads keys must be 1-based layer numbers (int >= 1), got {key!r}")
        if layer in normalised:
            raise ValueError(f"decore: heads names layer {layer} twice")
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise ValueError(f"decore: heads[{key!r}] must be a list of head indices, got {value!r}")
        indices = list(value)
        if not indices or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in indices):
            raise ValueError(
                f"decore: heads[{key!r}] must be a non-empty list of head indices (int >= 0), got {value!r}"
            )
        if len(set(indices)) != len(indices):
            raise ValueError(f"decore: heads[{key!r}] repeats a head index: {value!r}")
        normalised[layer] = tuple(sorted(indices))
    return dict(sorted(normalised.items()))


@register_method("decore")
class DecoreRule(ContrastRule):
    """z = (1 + a)·z_base − a·z_masked (retrieval heads masked), a = entropy of p_base (or fixed: "vanilla").

    >>> rule = DecoreRule()                                   # DeCoRe_entropy, the reference's share of discovered
    heads
    >>> rule = DecoreRule(heads={12: [0, 3], 15: [5]})        # explicit heads (1-based layers)
    >>> rule = DecoreRule(variant="vanilla", alpha=0.5, num_heads=20)
    """

    paths = (CONTEXT, MASKED_HEADS)

    def __init__(
        self,
        variant: str = "entropy",
        alpha: float | None = None,
        alpha_cap: float | None = None,
        scale_alpha: bool = False,
        heads: Mapping[int, Any] | None = None,
        num_heads: int | None = None,
        discovery: Mapping[str, Any] | None = None,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"decore: variant must be 'entropy' or 'vanilla', got {variant!r}")
        if variant == "entropy":
            if alpha is not None:
                raise ValueError(
                    "decore: alpha is the fixed strength of variant='vanilla'; the entropy variant sets it per token"
                )
        else:
            if alpha_cap is not None or scale_alpha:
                raise ValueError(
                    "decore: alpha_cap and scale_alpha shape the entropy variant's alpha; variant='vanilla' uses a "
                    "fixed alpha"
                )
            alpha = DEFAULT_VANILLA_ALPHA if alpha is None else alpha
            if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 0:
                raise ValueError(f"decore: alpha must be a finite number >= 0, got {alpha!r}")
            alpha = float(alpha)
        if alpha_cap is not None:
            number = not isinstance(alpha_cap, bool) and isinstance(alpha_cap, (int, float))
            if not number or not math.isfinite(alpha_cap) or alpha_cap <= 0:
                raise ValueError(f"decore: alpha_cap must be None (no cap) or a finite number > 0, got {alpha_cap!r}")
            alpha_cap = float(alpha_cap)
        if not isinstance(scale_alpha, bool):
            raise ValueError(f"decore: scale_alpha must be True or False, got {scale_alpha!r}")
        if heads is not None:
            if num_heads is not None or discovery is not None:
                raise ValueError(
                    "decore: give either explicit heads or num_heads/discovery (to discover them), not both"
                )
            heads = _normalise_heads(heads)
            settings = None
        else:
            if num_heads is not None and (
                isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1
            ):
                raise ValueError(f"decore: num_heads must be an integer >= 1, got {num_heads!r}")
            if discovery is not None and not isinstance(discovery, Mapping):
                raise ValueError(f"decore: discovery must be a mapping of DiscoverySettings fields, got {discovery!r}")
            try:
                settings = DiscoverySettings(**dict(discovery or {}))
            except TypeError as err:
                fields = ", ".join(DiscoverySettings.__dataclass_fields__)
                raise ValueError(f"decore: bad discovery settings ({err}); known settings: {fields}") from None
        self.variant = variant
        self.alpha = alpha
        self.alpha_cap = alpha_cap
        self.scale_alpha = scale_alpha
        self.heads = heads
        self.num_heads = num_heads
        self.discovery = settings

    def masked_heads(self, model: Any, tokenizer: Any) -> dict[int, tuple[int, ...]]:
        num_layers = ModelAnatomy.of(model).num_layers
        num_heads = int(model.config.num_attention_heads)
        if self.heads is None:
            total = num_layers * num_heads
            count = default_num_heads(total) if self.num_heads is None else self.num_heads
            if count > total:
                raise ValueError(
                    f"decore: num_heads={count} but the model has only {total} attention heads "
                    f"({num_layers} layers x {num_heads}); lower num_heads"
                )
            return retrieval_heads(model, tokenizer, count, self.discovery)
        too_deep = [layer for layer in self.heads if layer > num_layers]
        if too_deep:
            raise ValueError(f"decore: heads names layers {too_deep} but the model has {num_layers} (1-based)")
        too_high = {
            layer: [h for h in hs if h >= num_heads] for layer, hs in self.heads.items() if max(hs) >= num_heads
        }
        if too_high:
            raise ValueError(
                f"decore: head indices {too_high} out of range: the model has {num_heads} heads per layer (0-based)"
            )
        return dict(self.heads)

    def combine(self, step: StepInputs) -> StepOutput:
        base, masked = step.ctx_logits, step.masked_logits  # [B, V] each
        if masked is None:
            raise RuntimeError(
                "decore: the step carries no masked_logits; the decoder did not run the masked-heads path"
            )
        if self.variant == "entropy":
            alpha = decore_entropy(base, self.scale_alpha)  # [B]
            if self.alpha_cap is not None:
                alpha = alpha.clamp(max=self.alpha_cap)
        elif self.alpha is None:
            raise ValueError("decore: variant='vanilla' decodes with a fixed alpha; it is unset")
        else:
            alpha = torch.full((base.shape[0],), self.alpha, dtype=base.dtype, device=base.device)
        return StepOutput(logits=contrast_logits(base, masked, alpha), records={"alpha": alpha})

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"variant": self.variant}
        if self.variant == "entropy":
            options.update(alpha_cap=self.alpha_cap, scale_alpha=self.scale_alpha)
        else:
            options["alpha"] = self.alpha
        if self.heads is not None:
            options["heads"] = {layer: list(hs) for layer, hs in self.heads.items()}
        else:
            options.update(
                num_heads=self.num_heads if self.num_heads is not None else "auto (50/1024 of the heads)",
                discovery=(self.discovery or DiscoverySettings()).to_dict(),  # the discovery's own default
            )
        return options
