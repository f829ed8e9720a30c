"""Finding the retrieved context in what LlamaIndex hands to an LLM.

Query engines and chat engines call ``llm.predict(template, context_str=...)`` (or ``stream``,
``apredict``, ``astream``) with the query already partial-formatted into ``template.kwargs``.
The context travels in a template variable: ``context_str`` (text QA, simple_summarize,
tree_summarize) or ``context_msg`` (refine). FIDES needs two prompts: the template formatted as
given (the context path) and the same template with those variables emptied (the no-context
path), so everything else, the query and a refine stage's existing answer, stays in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.prompts.base import BasePromptTemplate, SelectorPromptTemplate

from fides_rag.prompts.template import context_text

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


def find_context(
    prompt: BasePromptTemplate, template_args: dict[str, Any], variables: Sequence[str], llm: Any, separator: str
) -> dict[str, str]:
    """The context variables present in this call (given now or partial-formatted before), as text."""
    chosen = selected_template(prompt, llm)
    known = {**(getattr(chosen, "kwargs", None) or {}), **(getattr(prompt, "kwargs", None) or {}), **template_args}
    used = set(prompt.template_vars) | set(getattr(chosen, "template_vars", []) or [])
    return {name: context_text(known[name], separator) for name in variables if name in used and name in known}
