"""FidesLLM's FunctionCallingLLM hooks (a mixin): tools in front of both paths, tool results as the evidence, calls read
back into `ChatMessage.additional_kwargs["tool_calls"]`.

A conversation with tools or tool messages is planned by the core (`fides_rag.calls.ChatPrompts`): the tool definitions
enter both paths identically (through the chat template where it renders `tools=`, else as a system block in the
fallback format of `fides_rag.calls.ToolCalling`), and the tool messages' contents are the context path's documents,
emptied on
the no-context path (`documents_source: "tool_messages"`). tool_required, "required" or a tool's name forces one valid
call by grammar.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.llms.fides.tools import tool_selections

from fides_rag.calls import ToolSpec, tool_choice_name


class FunctionCalling:
    """FidesLLM's tool hooks (reads the LLM's fields and decoder)."""

    # -- FunctionCallingLLM hooks ---------------------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[Any],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """chat's arguments: the messages, the tools and the choice (tool_required, "required" or a tool's name force a
        valid call by grammar; OpenAI's {"type": "function", "function": {"name": ...}} names one)."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(
                ChatMessage(role=MessageRole.USER, content=user_msg) if isinstance(user_msg, str) else user_msg
            )
        names = [ToolSpec.from_any(t).name for t in tools]
        return {
            "messages": messages,
            "tools": list(tools),
            "tool_choice": tool_choice_name(tool_choice, names, required=tool_required),
            **kwargs,
        }

    def _validate_chat_with_tools_response(
        self, response: ChatResponse, tools: Sequence[Any], allow_parallel_tool_calls: bool = False, **kwargs: Any
    ) -> ChatResponse:
        """Without allow_parallel_tool_calls, only the first call is kept."""
        calls = response.message.additional_kwargs.get("tool_calls") or []
        if not allow_parallel_tool_calls and len(calls) > 1:
            response.message.additional_kwargs["tool_calls"] = calls[:1]
        return response

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[Any]:
        """The response's calls as ToolSelections; with error_on_no_tool_call, none raises a ValueError."""
        selections = tool_selections(response)
        if not selections and error_on_no_tool_call:
            raise ValueError(
                f"Expected at least one tool call, but got 0 tool calls; the answer was {response.message.content!r}"
            )
        return selections
