"""Turning LlamaIndex chat messages into one prompt string with the tokenizer's own chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage

from fides_rag.calls import role_of
from fides_rag.raw_prompts import render_chat


def render_messages(tokenizer: Any, messages: Sequence[ChatMessage]) -> str:
    """The chat-templated prompt, ending with the assistant's generation prompt (the core's role map; tool results
    render as user turns, which every chat template accepts, as the core's planner renders them without tools)."""
    turns = [(role_of(m.role), m.content or "") for m in messages]
    return render_chat(tokenizer, [{"role": "user" if r == "tool" else r, "content": c} for r, c in turns])
