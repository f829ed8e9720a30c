"""The contract between a contrast rule and the decoder: the paths a rule declares, what one step hands it
keyed by path, and what it gives back (final logits plus named per-row values to record)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

CONTEXT = "context"
"""[d; x; y<t]: the documents, the question and the generated tokens. Every rule runs it."""
NO_CONTEXT = "no_context"
"""[x; y<t]: the question alone (CAD-style rules)."""
DOCUMENTS = "documents"
"""[d_n; x; y<t]: one path per document (DVD); needs >= 2 documents per question."""
MASKED_HEADS = "masked_heads"
"""The context path with the attention heads of `ContrastRule.masked_heads` zeroed (DeCoRe)."""
PATHS = (CONTEXT, NO_CONTEXT, DOCUMENTS, MASKED_HEADS)
"""Every path kind, in the order their rows sit in the decoder's batch."""
OptionalInput = Literal[
    "no_ctx_logits", "document_logits", "masked_logits", "ctx_layer_states", "no_ctx_layer_states", "document_mask"
]
"""The `StepInputs` a step carries only for a rule that declared their path (`StepInputs.require`)."""


@dataclass
class StepInputs:
    """What one decoding step computed for a batch of B examples, keyed by path, in float32.

    Build it with `StepInputs.from_tensors(...)` in tests; the decoder fills the dicts directly."""

    logits: dict[str, torch.Tensor]
    """path -> [B, V] next-token logits; DOCUMENTS -> [B, N, V], padded over examples to the largest document
    count N (padded entries are zeros and False in `document_mask`). Only the paths the rule declared."""
    layer_states: dict[str, torch.Tensor] = field(default_factory=dict)
    """path -> [L, B, H] last-position output of each transformer block (paths of `layer_state_paths`)."""
    lens_logits: dict[int, torch.Tensor] = field(default_factory=dict)
    """layer l (1-based) -> [B, V] logit-lens logits of the context path (layers of `lens_layers`)."""
    num_layers: int = 0
    document_mask: torch.Tensor | None = None
    """[B, N] bool, True where example b has a document n."""
    state: torch.Tensor | None = None
    """[B, state_size] what the rule kept per sequence from its previous step (zeros at a sequence's first step);
    None for rules whose `state_size` is 0."""
    end_tokens: torch.Tensor | None = None
    """[K] long: the token ids that end these rows' answers (their EOS ids, less those `min_new_tokens` holds back,
    and every token whose text holds one of their stop strings), for rules that declare `reads_end_tokens`; else
    None."""

    @classmethod
    def from_tensors(
        cls,
        ctx_logits: torch.Tensor,
        no_ctx_logits: torch.Tensor | None = None,
        *,
        ctx_layer_states: torch.Tensor | None = None,
        no_ctx_layer_states: torch.Tensor | None = None,
        lens_logits: Mapping[int, torch.Tensor] | None = None,
        num_layers: int = 0,
        document_logits: torch.Tensor | None = None,
        document_mask: torch.Tensor | None = None,
        masked_logits: torch.Tensor | None = None,
        end_tokens: torch.Tensor | None = None,
    ) -> StepInputs:
        """Inputs from named tensors (None: the path was not run); `end_tokens`: [K] ids that end the answer."""
        logits = {
            CONTEXT: ctx_logits,
            NO_CONTEXT: no_ctx_logits,
            DOCUMENTS: document_logits,
            MASKED_HEADS: masked_logits,
        }
        states = {CONTEXT: ctx_layer_states, NO_CONTEXT: no_ctx_layer_states}
        return cls(
            logits={k: v for k, v in logits.items() if v is not None},
            layer_states={k: v for k, v in states.items() if v is not None},
            lens_logits=dict(lens_logits or {}),
            num_layers=num_layers,
            document_mask=document_mask,
            end_tokens=end_tokens,
        )

    @property
    def ctx_logits(self) -> torch.Tensor:
        return self.logits[CONTEXT]

    @property
    def no_ctx_logits(self) -> torch.Tensor | None:
        return self.logits.get(NO_CONTEXT)

    @property
    def document_logits(self) -> torch.Tensor | None:
        return self.logits.get(DOCUMENTS)

    @property
    def masked_logits(self) -> torch.Tensor | None:
        return self.logits.get(MASKED_HEADS)

    @property
    def ctx_layer_states(self) -> torch.Tensor | None:
        return self.layer_states.get(CONTEXT)

    @property
    def no_ctx_layer_states(self) -> torch.Tensor | None:
        return self.layer_states.get(NO_CONTEXT)

    def require(self, name: OptionalInput) -> torch.Tensor:
        """The input `name` of a path the rule declared (the decoder always fills those); a ValueError naming it
        when it is missing, i.e. the rule reads a path it did not declare."""
        value: torch.Tensor | None = getattr(self, name)
        if value is None:
            raise ValueError(
                f"this step has no {name}: the rule reads a path it does not declare (paths, layer_state_paths)"
            )
        return value


@dataclass
class StepOutput:
    """The logits to pick the next token from, and what the rule wants recorded, per row."""

    logits: torch.Tensor
    """[B, V] final logits."""
    records: dict[str, torch.Tensor] = field(default_factory=dict)
    """name -> [B] per-row values (e.g. FIDES's alpha and signals, DVD's beta and gamma). They stay on the
    device during decoding and reach `StepRecord.values` once, at the end of the call."""
    state: torch.Tensor | None = None
    """[B, state_size] each row's state after this step, handed back as the next step's `StepInputs.state`."""


class ContrastRule(ABC):
    """One decoding rule (standard, CAD, AdaCAD, FIDES, ...). Subclasses register with `@register_method`.

    A rule is a small configured object. It declares what the decoder must compute (`paths`,
    `layer_state_paths`, `lens_layers`, `masked_heads`), and `combine` turns one step of it into logits.
    """

    name: ClassVar[str] = ""
    paths: ClassVar[tuple[str, ...]] = (CONTEXT, NO_CONTEXT)
    """The paths `combine` reads, from `PATHS`. CONTEXT is always run."""
    contrasts: ClassVar[bool] = True
    """Whether the rule contrasts anything (standard decoding does not, so a gate has nothing to guard)."""
    state_size: ClassVar[int] = 0
    """Values the rule keeps per sequence from one step to the next (`StepInputs.state`, `StepOutput.state`)."""
    reads_end_tokens: ClassVar[bool] = False
    """Whether `combine` reads `StepInputs.end_tokens` (the engine fills them only for such rules)."""

    @property
    def layer_state_paths(self) -> tuple[str, ...]:
        """Paths whose per-layer last-position states `combine` reads (FIDES's Shift)."""
        return ()

    def lens_layers(self, num_layers: int) -> tuple[int, ...]:
        """Which context-path layers (1-based) need logit-lens logits (single- or two-path rules alike)."""
        return ()

    def masked_heads(self, model: Any, tokenizer: Any) -> dict[int, tuple[int, ...]] | None:
        """Setup hook of the MASKED_HEADS path, called once per decode call before the prefill: the attention
        heads (1-based layer -> head indices) to zero on that path. None or empty: the path is not run and
        `StepInputs.masked_logits` is None. Model-dependent work (DeCoRe's head discovery) belongs here,
        never in `combine`."""
        return None

    @abstractmethod
    def combine(self, step: StepInputs) -> StepOutput:
        """Turn one step's path outputs into final logits. Runs on the device: no host synchronisation."""

    def options(self) -> dict[str, Any]:
        """The rule's settings, recorded with every result. Two objects of one registered rule class with equal
        options must decode alike: the engine serves their requests with one `combine` per step."""
        return {}

    @property
    def needs_no_context(self) -> bool:
        return NO_CONTEXT in self.paths

    @property
    def needs_document_paths(self) -> bool:
        return DOCUMENTS in self.paths

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({settings})"
