"""Per-architecture access to a causal LM's transformer blocks, final norm and output head.

The logit lens maps any layer's hidden state through the model's own final norm, output head
and final-logit soft-capping. Getting any of these wrong silently corrupts the Noise signal,
so only families whose anatomy has been checked (the lens at the last layer reproduces the
model's own logits, see tests/test_lens.py) are accepted.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fides_rag.errors import UnsupportedArchitectureError

# model_type -> name of the config attribute that holds final-logit soft-capping (None: the family has none)
SUPPORTED_FAMILIES: dict[str, str | None] = {
    "llama": None,  # also SmolLM / SmolLM2
    "mistral": None,
    "qwen2": None,
    "qwen3": None,
    "gemma": None,
    "gemma2": "final_logit_softcapping",
    "gemma3_text": "final_logit_softcapping",
}


def _cache_keyword(backbone: nn.Module) -> str:
    """The name under which the backbone's forward takes its KV cache."""
    return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"


@dataclass
class ModelAnatomy:
    """The parts of a decoder-only LM that dual-path decoding needs, found once per model."""

    model_type: str
    backbone: nn.Module
    """The transformer without its head (returns the final-normed last hidden state)."""
    layers: nn.ModuleList
    """The L transformer blocks, in order."""
    final_norm: nn.Module
    head: nn.Module
    softcap: float | None
    config: Any = None

    cache_keyword: str = field(init=False, repr=False)
    """The backbone forward's name for its KV cache, read once: `inspect.signature` costs more than a small model's
    decode step spends in attention, and a compiled step cannot call it."""

    def __post_init__(self) -> None:
        self.cache_keyword = _cache_keyword(self.backbone)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def run_backbone(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None,
        position_ids: torch.Tensor,
        cache: Any,
    ) -> tuple[torch.Tensor, Any]:
        """One cached forward of the backbone: (last hidden states [R, T, H], the updated cache).

        transformers 5.24 renamed the forward's `past_key_values` to `cache`; either name is passed as the model takes
        it.
        """
        kwargs = {self.cache_keyword: cache}
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True, **kwargs
        )
        updated = out["cache"] if "cache" in out else out["past_key_values"]
        return out.last_hidden_state, updated

    @property
    def num_heads(self) -> int:
        """Attention (query) heads per layer."""
        heads = getattr(self.config, "num_attention_heads", None)
        if not isinstance(heads, int) or heads <= 0:
            raise UnsupportedArchitectureError(f"{self.model_type}: the config has no positive num_attention_heads")
        return heads

    @property
    def head_dim(self) -> int:
        """Width of one head's output, the slice [h*head_dim:(h+1)*head_dim] of the attention output projection's
        input."""
        dim = getattr(self.config, "head_dim", None) or getattr(self.config, "hidden_size", 0) // self.num_heads
        if not isinstance(dim, int) or dim <= 0:
            raise UnsupportedArchitectureError(
                f"{self.model_type}: cannot tell the attention head width from the config"
            )
        return dim

    def attention_output_projections(self) -> list[nn.Linear]:
        """Each block's attention output projection `self_attn.o_proj`, whose input is the heads' outputs side by
        side ([..., num_heads * head_dim]); checked against the config."""
        width = self.num_heads * self.head_dim
        projections = []
        for index, layer in enumerate(self.layers, 1):
            proj = getattr(getattr(layer, "self_attn", None), "o_proj", None)
            if not isinstance(proj, nn.Linear) or proj.in_features != width:
                raise UnsupportedArchitectureError(
                    f"{self.model_type}: block {index} has no self_attn.o_proj linear layer over num_heads x "
                    "head_dim = "
                    f"{self.num_heads} x {self.head_dim} inputs, so attention heads cannot be masked on this model"
                )
            projections.append(proj)
        return projections

    def check_heads(self, heads: Mapping[int, Iterable[int]], owner: str) -> dict[int, tuple[int, ...]]:
        """Validate {layer (1-based): head indices (0-based)} against this model; sorted, without repeats or
        empty layers. `owner` names who asked (for the error message)."""
        if not isinstance(heads, Mapping):
            raise ValueError(
                f"{owner}: masked heads must be a mapping {{layer (1-based): head indices}}, got {type(heads).__name__}"
            )
        checked: dict[int, tuple[int, ...]] = {}
        for layer, indices in heads.items():
            if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= self.num_layers:
                raise ValueError(
                    f"{owner}: masked-heads layer {layer!r} is not a block of this {self.num_layers}-layer model "
                    f"(layers are 1-based: 1..{self.num_layers})"
                )
            if isinstance(indices, (str, bytes)) or not isinstance(indices, Iterable):
                raise ValueError(f"{owner}: the heads of layer {layer} must be a list of head indices, got {indices!r}")
            indices = list(indices)
            bad = [h for h in indices if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < self.num_heads]
            if bad:
                raise ValueError(
                    f"{owner}: heads {bad} of layer {layer} are not heads of this model (head indices are 0-based: "
                    f"0..{self.num_heads - 1})"
                )
            if indices:
                checked[layer] = tuple(sorted(set(indices)))
        return dict(sorted(checked.items()))

    @classmethod
    def of(cls, model: nn.Module) -> ModelAnatomy:
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_FAMILIES:
            raise UnsupportedArchitectureError(
                f"unsupported architecture {model_type!r} ({type(model).__name__}): fides-rag has a verified logit "
                "lens "
                f"only for {sorted(SUPPORTED_FAMILIES)}. Add the family to fides_rag/method/lens.py with a test "
                "that the lens "
                f"at the last layer reproduces the model's logits."
            )
        backbone = getattr(model, "model", None)
        layers = getattr(backbone, "layers", None)
        norm = getattr(backbone, "norm", None)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]  # checked by hasattr
        if backbone is None or layers is None or norm is None or head is None:
            raise UnsupportedArchitectureError(
                f"{type(model).__name__} ({model_type}) does not have the expected model.model.layers, "
                f"model.model.norm and output head; load it with AutoModelForCausalLM"
            )
        softcap_attr = SUPPORTED_FAMILIES[model_type]
        softcap = getattr(config, softcap_attr, None) if softcap_attr else None
        return cls(model_type, backbone, layers, norm, head, float(softcap) if softcap else None, config)

    def head_logits(self, normed_hidden: torch.Tensor) -> torch.Tensor:
        """Output head plus soft-capping on states that already went through the final norm.  [N, H] -> [N, V]"""
        logits = self._head_product(normed_hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _head_product(self, normed_hidden: torch.Tensor) -> torch.Tensor:
        """The head's matmul.  [N, H] -> [N, V]

        On CPU, MKL multiplies 2-3 rows by a wide head one row at a time: SmolLM2's [49152, 576] head takes
        31 ms for 2 rows against 14 ms for 1, gemma3's 162 ms against 69. The same dot products taken as
        weight @ states.T run as one matrix product (9 ms and 43 ms); results differ only in float rounding
        (about 1e-6, as batched `linear` differs from single-row). A plain, hook-free nn.Linear only: a head
        under accelerate hooks or other hooks runs as a module, so its weights are where its hooks put them."""
        head = self.head
        plain = (
            type(head) is nn.Linear
            and not (head._forward_hooks or head._forward_pre_hooks or hasattr(head, "_hf_hook"))
            and normed_hidden.device.type == "cpu"
            and normed_hidden.dim() == 2
            and normed_hidden.shape[0] > 1
            and head.weight.device == normed_hidden.device
            and head.weight.dtype == normed_hidden.dtype
        )
        if not plain:
            return head(normed_hidden)
        assert isinstance(head, nn.Linear)  # plain: exactly an nn.Linear
        rows = normed_hidden.shape[0]
        if rows == 3:  # MKL's narrow sgemm runs 4 columns faster than 3 (gemma3's head: 60 -> 54 ms): add a zero row
            normed_hidden = torch.cat([normed_hidden, normed_hidden.new_zeros(1, normed_hidden.shape[1])])
        logits = (head.weight @ normed_hidden.T)[:, :rows].T.contiguous()  # [V, N] -> [N, V]
        return logits if head.bias is None else logits + head.bias

    def lens_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logit lens: final norm, head and soft-capping applied to a raw block output.  [N, H] -> [N, V]"""
        return self.head_logits(self.final_norm(hidden))
