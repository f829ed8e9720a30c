"""Turning LlamaIndex chat messages into one prompt string with the tokenizer's own chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole

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


def merge_system_turns(turns: list[dict[str, str]]) -> list[dict[str, str]]:
    """For templates that refuse a system role: system text goes in front of the next user turn."""
    merged: list[dict[str, str]] = []
    pending = ""
    for turn in turns:
        if turn["role"] == "system":
            pending += turn["content"].strip() + "\n\n"
            continue
        if pending and turn["role"] == "user":
            turn = {"role": "user", "content": pending + turn["content"]}
            pending = ""
        merged.append(turn)
    if pending:
        merged.append({"role": "user", "content": pending.strip()})
    return merged


def leading_bos(tokenizer: Any) -> str | None:
    """The BOS text that the tokenizer adds by itself when encoding, or None.

    FidesDecoder.generate_from_prompts encodes raw prompts with the tokenizer's defaults, so a BOS
    already written by the chat template would appear twice; callers strip it from the text.
    """
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if not bos or bos_id is None:
        return None
    ids = tokenizer("a")["input_ids"]
    return bos if ids and ids[0] == bos_id else None


def render_messages(tokenizer: Any, messages: Sequence[ChatMessage]) -> str:
    """The chat-templated prompt, ending with the assistant's generation prompt."""
    turns = as_template_turns(messages)
    try:
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except Exception:  # jinja2 TemplateError: e.g. "System role not supported"
        text = tokenizer.apply_chat_template(merge_system_turns(turns), tokenize=False, add_generation_prompt=True)
    bos = leading_bos(tokenizer)
    if bos and text.startswith(bos):
        text = text[len(bos) :]
    return text
