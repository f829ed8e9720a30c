"""Turning LlamaIndex chat messages into one prompt string with the tokenizer's own chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole

from fides_rag.raw_prompts import render_chat

_ROLE_NAMES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.TOOL: "user",
    MessageRole.FUNCTION: "user",
}


def as_template_turns(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    return [{"role": _ROLE_NAMES.get(m.role, "user"), "content": m.content or ""} for m in messages]


def render_messages(tokenizer: Any, messages: Sequence[ChatMessage]) -> str:
    """The chat-templated prompt, ending with the assistant's generation prompt (fides_rag.raw_prompts.render_chat:
    no doubled BOS, system turns merged where the template refuses them)."""
    return render_chat(tokenizer, as_template_turns(messages))
