"""LlamaIndex's tool calls and messages as the core's (`fides_rag.calls`): calls travel in
`ChatMessage.additional_kwargs["tool_calls"]` in OpenAI's shape, as llama-index's OpenAI LLM keeps them; earlier calls
are also read from Ollama's shape and from `ToolCallBlock`s."""

from __future__ import annotations

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection

from fides_rag.calls import ToolCall, calls_from_openai


def message_calls(message: ChatMessage) -> list[ToolCall]:
    """The tool calls an assistant message carries: additional_kwargs["tool_calls"] or ToolCallBlocks."""
    calls = calls_from_openai(message.additional_kwargs.get("tool_calls") or [])
    for block in message.blocks:
        if isinstance(block, ToolCallBlock) and not any(c.id and c.id == block.tool_call_id for c in calls):
            calls += calls_from_openai(
                [{"name": block.tool_name, "arguments": block.tool_kwargs, "id": block.tool_call_id}]
            )
    return calls


def tool_selections(response: ChatResponse) -> list[ToolSelection]:
    """The response's calls as LlamaIndex ToolSelections."""
    return [
        ToolSelection(tool_id=c.id, tool_name=c.name, tool_kwargs=c.arguments) for c in message_calls(response.message)
    ]
