"""An agent's answering turn that answers nothing: its text is empty (the model ended its turn at once, or began a
tool's result, which is where the answer stops), or it is a tool call where none may be made (no tools, tool_choice
"none", or a tool that is not bound). Such a turn is decoded once more under the answer rules: its first token may
be neither the end of the turn nor the start of markup. When that answers nothing either, the Answer carries the
cause (`Answer.unanswered`, and a note in its record) and the framework integrations raise `UnansweredError`.

An agent's turn is one with tools bound or tool results in the conversation, that answers in free text (no forced
call, no structured answer)."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, Protocol

import torch
from transformers import LogitsProcessor, LogitsProcessorList

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from fides_rag.calls.options import CallOptions
    from fides_rag.calls.tools import ToolCalling
    from fides_rag.decoder import FidesDecoder
    from fides_rag.result import GenerationResult

MARKUP_STARTS = ("<", "{", "[")
_CALL_START = re.compile(r'\s*\[?\s*\{\s*"(?:name|function)"\s*:')
"""What an answer's first token may not start with under the answer rules (a tag, a bare JSON call)."""


class _PlanSource(Protocol):
    @property
    def source(self) -> str: ...


class AgentTurn(Protocol):
    """What the answer rules read of a call (`answering.Call`, which imports this module)."""

    @property
    def structure(self) -> object: ...
    @property
    def options(self) -> CallOptions: ...
    @property
    def calling(self) -> ToolCalling | None: ...
    @property
    def plan(self) -> _PlanSource: ...
    @property
    def decoder(self) -> FidesDecoder: ...


def is_agent_turn(call: AgentTurn) -> bool:
    """Whether `call` is an agent's turn that answers in free text."""
    free = call.structure is None and not call.options.constraint and (call.calling is None or not call.calling.forced)
    return free and (call.calling is not None or call.plan.source == "tool_messages")


def call_shaped(text: str) -> bool:
    """Whether `text`, as a whole answer, is a tool call or the start of one ({"name": ..., bare, in a list or in a
    `<tool_call>` block; complete or cut)."""
    text = text.strip()
    if text.startswith("<tool_call>"):
        text = text[len("<tool_call>") :]
    return _CALL_START.match(text) is not None


def unanswered_cause(call: AgentTurn, text: str, tool_calls: list, result: GenerationResult) -> str | None:
    """Why an agent's turn answered nothing (None: it answered, or it is not an agent's turn)."""
    if not is_agent_turn(call) or tool_calls:
        return None
    if call_shaped(text):
        calling = call.calling
        why = (
            "no tools are bound"
            if calling is None or not calling.tools
            else "tool_choice='none' allows no call"
            if calling.tool_choice == "none"
            else "it is not a complete call of a bound tool"
        )
        return f"it wrote a tool call as its answer ({text.strip()[:80]!r}) where {why}"
    if text.strip():
        return None
    raw = call.decoder.decode_text(result.token_ids).strip()
    if not raw:
        return "it ended its turn at once (its first token was the end of the turn)"
    if result.finish_reason == "stop":
        return f"it began with {raw[:40]!r}, where the answer stops (a stop string), instead of answering"
    return f"all it wrote ({raw[:40]!r}) was cut from the answer"


class BarredFirstToken(LogitsProcessor):
    """Bars `token_ids` from the first token it sees a request choose (transformers' logits processor, one per
    request: the first call marks where the answer starts)."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = torch.tensor(sorted(set(token_ids)), dtype=torch.long)
        self.start: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.start is None:
            self.start = input_ids.shape[-1]
        if input_ids.shape[-1] != self.start:
            return scores
        if self.token_ids.device != scores.device:
            self.token_ids = self.token_ids.to(scores.device)
        scores = scores.clone()  # type: ignore[assignment]  # transformers types scores as FloatTensor
        scores[:, self.token_ids[self.token_ids < scores.shape[-1]]] = -float("inf")
        return scores


@functools.lru_cache(maxsize=8)
def _markup_or_empty_tokens(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The tokenizer's ids whose text is empty, blank or starts with markup (special tokens included)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
    barred = {i for i, t in enumerate(texts) if not t.strip() or t.lstrip().startswith(MARKUP_STARTS)}
    return tuple(sorted(barred | set(tokenizer.all_special_ids)))


def answer_rules(decoder: FidesDecoder, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The decoder's keywords `kwargs` under the answer rules: the end of turn, blank tokens and markup barred from
    the first token (after any logits processors of the call's own)."""
    barred = [*_markup_or_empty_tokens(decoder.tokenizer), *decoder.eos_token_ids]
    processors = LogitsProcessorList([*(kwargs.get("logits_processor") or []), BarredFirstToken(barred)])
    return {**kwargs, "logits_processor": processors}
