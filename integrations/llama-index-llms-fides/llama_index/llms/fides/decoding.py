"""One FidesLLM call through the core call layer (`fides_rag.calls`): its options, its Call, and the LlamaIndex
responses of its Answer (a mixin of FidesLLM)."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse, MessageRole
from llama_index.llms.fides.options import CALL_OPTIONS, GENERATION_OPTIONS

from fides_rag.calls import Answer, Call, CallOptions, ChatPlan, ToolCalling, UnansweredError

PAIR_EXTRAS = ("documents_source", "num_documents", "tool_format", "tool_choice")
"""What the response's raw dict carries beside the result (an agent's final output carries only `raw`)."""


class PairDecoding:
    """FidesLLM's decoding: options, the call, its record in the history, and the responses."""

    if TYPE_CHECKING:  # what FidesLLM gives this mixin
        effective_fides_config: Any
        _calls: Any
        _history: Any

    def _options(self, kwargs: dict[str, Any]) -> CallOptions:
        """This LLM's fields overridden by one call's keywords (unknown keywords: a TypeError naming them)."""
        defaults = {name: getattr(self, name) for name in (*GENERATION_OPTIONS, "strict")}
        defaults["fides_config"] = self.effective_fides_config
        return CallOptions.parse(defaults, kwargs, allowed=CALL_OPTIONS, who="FidesLLM")

    def _call(self, plan: ChatPlan, options: CallOptions, calling: ToolCalling | None = None) -> Call:
        return self._calls.call(plan, options, calling)

    def _raw(self, answer: Answer) -> dict[str, Any]:
        return {**answer.result.to_dict(), **{k: answer.record[k] for k in PAIR_EXTRAS if k in answer.record}}

    def _respond(self, answer: Answer, chat: bool, text: str | None = None, delta: str | None = None) -> Any:
        """The LlamaIndex response of `answer`, or UnansweredError when an agent's turn answered nothing (with the
        cause; the record is kept in the history)."""
        info = self._history.add(answer).record
        if answer.unanswered is not None:
            raise UnansweredError(answer.unanswered, answer)
        if not chat:
            return CompletionResponse(
                text=answer.text if text is None else text, delta=delta, raw=self._raw(answer), additional_kwargs=info
            )
        extra = {"tool_calls": [c.openai() for c in answer.tool_calls]} if answer.tool_calls else {}
        message = ChatMessage(role=MessageRole.ASSISTANT, content=answer.text, additional_kwargs=extra)
        return ChatResponse(message=message, delta=delta, raw=self._raw(answer), additional_kwargs=info)

    def _generate(
        self, plan: ChatPlan, options: CallOptions, calling: ToolCalling | None = None, chat: bool = False
    ) -> Any:
        return self._respond(self._call(plan, options, calling).run(), chat)

    def _stream(
        self, plan: ChatPlan, options: CallOptions, calling: ToolCalling | None = None, chat: bool = False
    ) -> Generator[Any, None, None]:
        """Responses as the answer grows; one delta is held back so that the last response carries the record."""
        text = ""
        for delta, answer in self._call(plan, options, calling).deltas():
            text += delta
            if answer is not None:
                yield self._respond(answer, chat, text, delta)
            elif chat:
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)
            else:
                yield CompletionResponse(text=text, delta=delta)
