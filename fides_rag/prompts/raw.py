"""Raw prompts built outside fides-rag's template (a framework's own prompt or chat), made ready for
`FidesDecoder.generate(PromptPair(...))`: chat rendering without a doubled BOS, and documents trimmed to the window
with a note.

The integrations call these; the decoder itself renders its own template in `prompts.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic

from fides_rag.prompts.template import PromptTemplate, Rendered, fit_texts

NO_CONTEXT_PATHS = ("emptied", "question")
"""How an integration builds the no-context path from a framework's prompt: 'emptied' (the same prompt with its
documents removed) or 'question' (a neutral question-only prompt, `question_only_text`, in the framework's chat
form)."""


def leading_bos(tokenizer: Any) -> str | None:
    """The BOS text the tokenizer adds by itself when encoding (None when it adds none).

    A `PromptPair` is encoded with the tokenizer's defaults, so a BOS that a chat
    template already wrote would appear twice.
    """
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if not bos or bos_id is None:
        return None
    ids = tokenizer("a")["input_ids"]
    return bos if ids and ids[0] == bos_id else None


def strip_leading_bos(tokenizer: Any, text: str) -> str:
    """`text` without a leading BOS that encoding would add again."""
    bos = leading_bos(tokenizer)
    return text[len(bos) :] if bos and text.startswith(bos) else text


def merge_system_turns(turns: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """For chat templates that refuse a system role: system text goes in front of the next user turn."""
    merged: list[dict[str, str]] = []
    pending = ""
    for turn in turns:
        if turn["role"] == "system":
            pending += turn["content"].strip() + "\n\n"
            continue
        if pending and turn["role"] == "user":
            turn = {"role": "user", "content": pending + turn["content"]}
            pending = ""
        merged.append(dict(turn))
    if pending:
        merged.append({"role": "user", "content": pending.strip()})
    return merged


def render_chat(
    tokenizer: Any, turns: Sequence[Mapping[str, str]], tools: Sequence[Mapping[str, Any]] | None = None
) -> str:
    """The tokenizer's chat template over `turns` ({"role", "content"}), ending with the assistant's generation
    prompt, without a BOS that encoding adds again. A template that refuses a system role gets it merged. `tools`
    (OpenAI function tools) are passed to the template as `tools=`."""
    turns = [dict(t) for t in turns]
    extra = {"tools": [dict(t) for t in tools]} if tools else {}
    try:
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **extra)
    except Exception:  # jinja2 TemplateError, e.g. "System role not supported"
        text = tokenizer.apply_chat_template(
            merge_system_turns(turns), tokenize=False, add_generation_prompt=True, **extra
        )
    return strip_leading_bos(tokenizer, text)


@dataclass
class FittedPrompt(Generic[Rendered]):
    """A prompt rendered with its documents, trimmed to fit: what was kept and what to tell the caller."""

    rendered: Rendered
    texts: dict[str, str]
    """The documents as kept (cut at the tail where trimmed), by name."""
    trimmed: bool
    document_tokens: tuple[int, int] | None
    """(before, after) token counts of the documents when trimmed, else None."""
    notes: list[str]
    """One note when trimmed (also the text to log), else none."""


def fit_documents(
    texts: Mapping[str, str],
    render: Callable[[dict[str, str]], Rendered],
    tokenizer: Any,
    *,
    context_window: int,
    max_new_tokens: int,
    count: Callable[[Rendered], int] | None = None,
) -> FittedPrompt[Rendered]:
    """Render a raw prompt from named document texts, cutting the longest while the prompt plus `max_new_tokens`
    exceeds `context_window` (the rule of `prompts.fit_texts`). `count` measures a rendering in tokens (default:
    the tokenizer's length of a string rendering)."""
    if count is None:
        count = lambda rendered: len(tokenizer(rendered)["input_ids"])  # noqa: E731
    fitted = fit_texts(texts, render, count, context_window - max_new_tokens, tokenizer, max_new_tokens=max_new_tokens)
    if not fitted.trimmed:
        return FittedPrompt(fitted.rendered, fitted.texts, False, None, [])
    note = fitted.note(max_new_tokens, context_window)
    return FittedPrompt(fitted.rendered, fitted.texts, True, (fitted.tokens_before, fitted.tokens_after), [note])


def question_only_text(question: str) -> str:
    """The no-context path's user turn under the 'question' design: the source's neutral instruction (fides-rag's
    template's no-context instruction, "Answer the following question:") and the question."""
    return f"{PromptTemplate.no_context_instruction}\n{question.strip()}"


def check_no_context_path(value: str) -> str:
    """`value` if it names a no-context design, else a ValueError listing them."""
    if value not in NO_CONTEXT_PATHS:
        raise ValueError(f"no_context_path must be one of {', '.join(map(repr, NO_CONTEXT_PATHS))}, got {value!r}")
    return value
