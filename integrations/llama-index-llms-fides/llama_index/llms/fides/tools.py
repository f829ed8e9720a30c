"""LlamaIndex's tools, tool choices and tool calls, adapted to the core's `fides_rag.tool_calls`.

Tools come from `_prepare_chat_with_tools` (LlamaIndex `BaseTool`s), or are given to chat as `tools=` (BaseTool,
`fides_rag.tool_calls.ToolSpec` or OpenAI dicts). Calls travel in `ChatMessage.additional_kwargs["tool_calls"]` in
OpenAI's shape, as llama-index's OpenAI LLM keeps them; earlier calls are also read from Ollama's shape and from
`ToolCallBlock`s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection

from fides_rag.tool_calls import CHOICES, ToolCall, ToolCalling, ToolSpec

logger = logging.getLogger("llama_index.llms.fides")

ROLES = {
    MessageRole.SYSTEM: "system", MessageRole.DEVELOPER: "system", MessageRole.USER: "user", MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant", MessageRole.MODEL: "assistant", MessageRole.TOOL: "tool", MessageRole.FUNCTION: "tool",
}
"""LlamaIndex's roles as the core's turn roles (user, assistant, system, tool)."""


def tool_specs(tools: Sequence[Any]) -> list[ToolSpec]:
    """LlamaIndex tools (anything with `.metadata.to_openai_tool()`), ToolSpecs or OpenAI tool dicts as ToolSpecs."""
    specs = []
    for tool in tools:
        if isinstance(tool, ToolSpec):
            specs.append(tool)
        elif isinstance(tool, Mapping):
            specs.append(ToolSpec.from_openai(tool))
        elif hasattr(getattr(tool, "metadata", None), "to_openai_tool"):
            specs.append(ToolSpec.from_openai(tool.metadata.to_openai_tool(skip_length_check=True)))
        else:
            raise TypeError(f"tools must be LlamaIndex tools, fides_rag ToolSpecs or OpenAI tool dicts, got {type(tool).__name__}")
    return specs


def choice_name(tool_choice: Any, tool_required: bool) -> str:
    """tool_choice as the core's string: "auto", "none", "required", a tool's name, or OpenAI's dict
    {"type": "function", "function": {"name": ...}}; None is "required" when `tool_required`, else "auto"."""
    if tool_choice is None:
        return "required" if tool_required else "auto"
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        if not name and tool_choice.get("type") in CHOICES:
            return tool_choice["type"]
        if not isinstance(name, str):
            raise ValueError(f"tool_choice dict must name a function ({{'type': 'function', 'function': {{'name': ...}}}}), got {dict(tool_choice)!r}")
        return name
    if isinstance(tool_choice, str):
        if tool_required and tool_choice in ("auto", "none"):
            raise ValueError(f"tool_required=True contradicts tool_choice={tool_choice!r}")
        return tool_choice
    raise TypeError(f"tool_choice must be a string or a dict, got {type(tool_choice).__name__}")


def tool_calling(tokenizer: Any, kwargs: dict[str, Any]) -> ToolCalling | None:
    """The call's ToolCalling from its `tools` and `tool_choice` (None when no tools were given)."""
    tools, choice = kwargs.get("tools"), kwargs.get("tool_choice")
    if not tools:
        if choice not in (None, "auto", "none"):
            raise ValueError(f"tool_choice={choice!r} needs tools: use chat_with_tools(tools, ...) or chat(messages, tools=[...])")
        return None
    return ToolCalling(tokenizer, tool_specs(tools), choice_name(choice, False))


def _arguments(value: Any) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return {}
    return dict(value) if isinstance(value, Mapping) else {}


def message_calls(message: ChatMessage) -> list[ToolCall]:
    """The tool calls an assistant message carries: additional_kwargs["tool_calls"] (OpenAI's or Ollama's shape, dicts
    or objects) or ToolCallBlocks."""
    calls = []
    for item in message.additional_kwargs.get("tool_calls") or []:
        get = item.get if isinstance(item, Mapping) else lambda k, d=None, o=item: getattr(o, k, d)
        function = get("function") or {}
        fget = function.get if isinstance(function, Mapping) else lambda k, d=None, o=function: getattr(o, k, d)
        if fget("name"):
            calls.append(ToolCall(fget("name"), _arguments(fget("arguments")), get("id") or ""))
    for block in message.blocks:
        if isinstance(block, ToolCallBlock) and not any(c.id and c.id == block.tool_call_id for c in calls):
            calls.append(ToolCall(block.tool_name, _arguments(block.tool_kwargs), block.tool_call_id or ""))
    return calls


def message_turn(message: ChatMessage, calling: ToolCalling) -> tuple[str, str]:
    """A message as a (role, text) turn; an assistant's earlier calls are written after its content."""
    role = ROLES.get(message.role, "user")
    text = message.content or ""
    calls = message_calls(message) if role == "assistant" else []
    return role, calling.render_calls(text, calls) if calls else text


def openai_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """The core's calls as `additional_kwargs["tool_calls"]` (OpenAI's shape, arguments as a JSON string)."""
    return [c.openai() for c in calls]


def tool_selections(response: ChatResponse) -> list[ToolSelection]:
    """The response's calls as LlamaIndex ToolSelections."""
    return [ToolSelection(tool_id=c.id, tool_name=c.name, tool_kwargs=c.arguments) for c in message_calls(response.message)]


def note_missing_call(calling: ToolCalling | None, calls: Sequence[ToolCall], info: dict[str, Any], max_new_tokens: int) -> None:
    """A forced call that did not finish (cut at max_new_tokens) gives no call: say so in the notes and the log."""
    note = calling.missing_call_note(calls, max_new_tokens) if calling is not None else None
    if note is not None:
        logger.warning(note)
        info["notes"] = [*info.get("notes", []), note]
