"""Per-architecture access to a causal LM's transformer blocks, final norm and output head.

The logit lens maps any layer's hidden state through the model's own final norm, output head
and final-logit soft-capping. Getting any of these wrong silently corrupts the Noise signal,
so only families whose anatomy has been checked (the lens at the last layer reproduces the
model's own logits, see tests/test_lens.py) are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

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


class UnsupportedArchitectureError(ValueError):
    """The model's family has no verified logit lens, so FIDES's Noise signal cannot be trusted on it."""


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

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @classmethod
    def of(cls, model: nn.Module) -> ModelAnatomy:
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_FAMILIES:
            raise UnsupportedArchitectureError(
                f"unsupported architecture {model_type!r} ({type(model).__name__}): fides-rag has a verified logit lens "
                f"only for {sorted(SUPPORTED_FAMILIES)}. Add the family to fides_rag/lens.py with a test that the lens "
                f"at the last layer reproduces the model's logits."
            )
        backbone = getattr(model, "model", None)
        layers = getattr(backbone, "layers", None)
        norm = getattr(backbone, "norm", None)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if backbone is None or layers is None or norm is None or head is None:
            raise UnsupportedArchitectureError(
                f"{type(model).__name__} ({model_type}) does not have the expected model.model.layers, "
                f"model.model.norm and output head; load it with AutoModelForCausalLM"
            )
        softcap_attr = SUPPORTED_FAMILIES[model_type]
        softcap = getattr(config, softcap_attr, None) if softcap_attr else None
        return cls(model_type, backbone, layers, norm, head, float(softcap) if softcap else None)

    def head_logits(self, normed_hidden: torch.Tensor) -> torch.Tensor:
        """Output head plus soft-capping on states that already went through the final norm.  [N, H] -> [N, V]"""
        logits = self.head(normed_hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def lens_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logit lens: final norm, head and soft-capping applied to a raw block output.  [N, H] -> [N, V]"""
        return self.head_logits(self.final_norm(hidden))
