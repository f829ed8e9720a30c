"""Finding the retrieved context in what LlamaIndex hands to an LLM.

Query engines and chat engines call ``llm.predict(template, context_str=...)`` (or ``stream``,
``apredict``, ``astream``) with the query already partial-formatted into ``template.kwargs``.
The context travels in a template variable: ``context_str`` (text QA, simple_summarize,
tree_summarize) or ``context_msg`` (refine). FIDES needs two prompts: the template formatted as
given (the context path) and the same template with those variables emptied (the no-context
path), so everything else, the query and a refine stage's existing answer, stays in both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts.base import BasePromptTemplate, SelectorPromptTemplate

from fides_rag.prompts import document_texts

CONTEXT_VARIABLES: tuple[str, ...] = ("context_str", "context_msg")
"""Template variables that carry retrieved text in llama-index-core 0.14's prompts."""


def selected_template(prompt: BasePromptTemplate, llm: Any) -> BasePromptTemplate:
    """The template a SelectorPromptTemplate would use for `llm`; other templates as they are."""
    if isinstance(prompt, SelectorPromptTemplate):
        return prompt.select(llm=llm)
    return prompt


def prompt_type(prompt: BasePromptTemplate, llm: Any) -> str | None:
    """The stage of a response synthesizer: "text_qa", "refine", "summary", "custom", ..."""
    for candidate in (prompt, selected_template(prompt, llm)):
        value = (getattr(candidate, "metadata", None) or {}).get("prompt_type")
        if value is not None:
            return str(getattr(value, "value", value))
    return None


def context_as_text(value: Any, separator: str) -> str:
    """One context value as text: a string as is, a list (simple_summarize passes one) joined.

    List items may be strings, LlamaIndex nodes or NodeWithScore objects (anything with `.text`);
    anything else raises a TypeError that names its type.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return separator.join(document_texts(list(value)))
    return separator.join(document_texts([value]))


def split_prompt_args(
    prompt: BasePromptTemplate, prompt_args: dict[str, Any], option_names: Iterable[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate template variables from generation options passed to predict(**prompt_args).

    A key that the template uses is always a template variable; a known option name that the
    template does not use (e.g. ``method``, ``max_new_tokens``) is a per-call generation option.
    """
    template_vars = set(prompt.template_vars)
    options = {k: v for k, v in prompt_args.items() if k in option_names and k not in template_vars}
    template_args = {k: v for k, v in prompt_args.items() if k not in options}
    return template_args, options


def find_context(
    prompt: BasePromptTemplate, template_args: dict[str, Any], variables: Sequence[str], llm: Any, separator: str
) -> dict[str, str]:
    """The context variables present in this call (given now or partial-formatted before), as text."""
    chosen = selected_template(prompt, llm)
    known = {**(getattr(chosen, "kwargs", None) or {}), **(getattr(prompt, "kwargs", None) or {}), **template_args}
    used = set(prompt.template_vars) | set(getattr(chosen, "template_vars", []) or [])
    return {name: context_as_text(known[name], separator) for name in variables if name in used and name in known}


# -- chat messages ------------------------------------------------------------------------------


def check_has_user_message(messages: Sequence[ChatMessage]) -> None:
    if not messages:
        raise ValueError("chat needs at least one message, got an empty list")
    if not any(m.role == MessageRole.USER for m in messages):
        roles = [getattr(m.role, "value", m.role) for m in messages]
        raise ValueError(f"chat history has no user message (roles: {roles}); FIDES needs a question to answer")


def with_context_message(messages: Sequence[ChatMessage], template: str, context: str) -> list[ChatMessage]:
    """Put `template.format(context_str=context)` in front of the first system message (or as a new one),
    as ContextChatEngine does."""
    text = template.replace("{context_str}", context)
    if messages and messages[0].role == MessageRole.SYSTEM:
        first = ChatMessage(role=MessageRole.SYSTEM, content=text + (messages[0].content or "").strip())
        return [first, *messages[1:]]
    return [ChatMessage(role=MessageRole.SYSTEM, content=text), *messages]
