"""The interface every contrast rule implements: what it needs from a step, and how it combines it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


@dataclass
class StepInputs:
    """What one decoding step computed for a batch of B examples, in float32."""

    ctx_logits: torch.Tensor
    """[B, V] next-token logits of the context path [d; x; y<t]."""
    no_ctx_logits: torch.Tensor | None
    """[B, V] logits of the no-context path [x; y<t]; None for single-path rules."""
    ctx_layer_states: torch.Tensor | None = None
    """[L, B, H] last-position output of each transformer block, context path (if the rule asked)."""
    no_ctx_layer_states: torch.Tensor | None = None
    """[L, B, H] the same for the no-context path."""
    lens_logits: dict[int, torch.Tensor] | None = None
    """layer l (1-based) -> [B, V] logit-lens logits of the context path (if the rule asked)."""
    num_layers: int = 0
    document_logits: torch.Tensor | None = None
    """[B, N, V] logits of the per-document paths [d_n; x; y<t] (if `needs_document_paths`), padded over
    examples to the largest document count N; padded entries are zeros and False in `document_mask`."""
    document_mask: torch.Tensor | None = None
    """[B, N] bool, True where example b has a document n."""
    masked_logits: torch.Tensor | None = None
    """[B, V] logits of the context path run with the heads of `masked_heads` zeroed (if it returned any)."""


@dataclass
class StepOutput:
    """The logits to pick the next token from, and what the rule wants recorded, per row."""

    logits: torch.Tensor
    """[B, V] final logits."""
    alpha: torch.Tensor | None = None
    opposition: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    noise: torch.Tensor | None = None
    score: torch.Tensor | None = None


class ContrastRule(ABC):
    """One decoding rule (standard, CAD, AdaCAD, FIDES, ...). Subclasses register with `@register_method`.

    A rule is a small configured object; the decoder asks it what to compute (`needs_*`, `lens_layers`)
    and then calls `combine` once per step with all paths of all examples.
    """

    name: ClassVar[str] = ""
    needs_no_context: ClassVar[bool] = True
    """Whether the no-context path [x; y<t] must be run at all."""

    @property
    def needs_layer_states(self) -> bool:
        """Whether `combine` reads the per-layer states of both paths."""
        return False

    needs_document_paths: ClassVar[bool] = False
    """Whether the decoder also runs one path per document, [d_n; x; y<t] (DVD). Needs >= 2 documents."""

    def masked_heads(self, model: Any, tokenizer: Any) -> dict[int, tuple[int, ...]] | None:
        """Attention heads (1-based layer -> head indices) whose outputs are zeroed on an extra copy of the
        context path (DeCoRe); None means the rule needs no such path. Called once per decode call."""
        return None

    def lens_layers(self, num_layers: int) -> tuple[int, ...]:
        """Which context-path layers (1-based) need logit-lens logits (single- or two-path rules alike)."""
        return ()

    @abstractmethod
    def combine(self, step: StepInputs) -> StepOutput:
        """Turn one step's path outputs into final logits."""

    def options(self) -> dict[str, Any]:
        """The rule's settings, recorded with every result."""
        return {}

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({settings})"
