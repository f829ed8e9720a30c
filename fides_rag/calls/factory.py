"""The one way a front door (LangChain, LlamaIndex, the server) makes its calls on a decoder: its tool calling from
tools and tool_choice, its planner (with the tools bound), and the `Call`, whose record says whether the chat template
rendered the tools. The decoder's batching is set once, when the factory is made."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack  # typing.Unpack from Python 3.11 on

from fides_rag.calls.answering import Call
from fides_rag.calls.options import CallOptions
from fides_rag.calls.planning import ChatPlan, ChatPrompts, PlannerSettings
from fides_rag.calls.tools import ToolCalling, ToolChoice

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder


class CallFactory:
    """A front door's calls on one decoder.

    `planning`: the planner's settings for every call (use_chat_template, no_context_path, documents_instruction, ...:
    `ChatPrompts.for_decoder`'s keywords). `max_batch_size` and `batch_window_s`: how many concurrent calls decode
    together and how long a call waits for others, set on the decoder here, once (None: left as they are)."""

    def __init__(
        self,
        decoder: FidesDecoder,
        *,
        max_batch_size: int | None = None,
        batch_window_s: float | None = None,
        **planning: Unpack[PlannerSettings],
    ) -> None:
        self.decoder, self.planning = decoder, planning
        batching = {
            name: value
            for name, value in (("max_requests", max_batch_size), ("window_s", batch_window_s))
            if value is not None
        }
        if batching:
            decoder.configure(**batching)
        self._chat = self.planner()

    def tools(
        self, tools: Sequence[Any] | None, tool_choice: ToolChoice = None, *, required: bool = False
    ) -> ToolCalling | None:
        """The call's tool calling, or None without tools (a forcing tool_choice without tools is refused)."""
        return ToolCalling.of_call(self.decoder.tokenizer, tools, tool_choice, required=required)

    def planner(self, calling: ToolCalling | None = None, **overrides: Unpack[PlannerSettings]) -> ChatPrompts:
        """The planner of a call with `calling`'s tools in front of both paths; `overrides` change this call's
        planning settings (e.g. `chat=False` for a completion, a request's `no_context_path`)."""
        settings: PlannerSettings = {**self.planning, **overrides}
        return ChatPrompts.for_decoder(self.decoder, **settings, tools=calling)

    def renders_tools(self, calling: ToolCalling | None) -> bool:
        """Whether the chat template renders `calling`'s tools itself (else they go in the fallback system block)."""
        return self._chat.renders_tools(calling)

    def call(
        self,
        plan: ChatPlan,
        options: CallOptions,
        calling: ToolCalling | None = None,
        *,
        structure: object = None,
        extra: dict[str, Any] | None = None,
    ) -> Call:
        """The call of `plan` (bad input raises here: `CallInputError`, `FidesFallbackError` when strict)."""
        return Call(
            self.decoder,
            plan,
            options,
            calling=calling,
            native_tools=self.renders_tools(calling),
            structure=structure,
            extra=extra,
        )
