"""fides-rag's own 2-shot QA template as a LlamaIndex `text_qa_template` (the equivalent of langchain-fides'
`fides_rag_prompt()`).

    engine = index.as_query_engine(llm=llm, text_qa_template=fides_rag_qa_template())

A FidesLLM recognises the template and decodes with fides-rag's template on both paths: the context
path holds the retrieved text (`context_str`) as the document and the query as the question, the
no-context path the question alone with the no-context instruction, as `FidesDecoder.generate` does.
Any other LLM sees an ordinary prompt: the context branch of that template, rendered as text.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.prompts import PromptTemplate
from llama_index.core.prompts.prompt_type import PromptType

from fides_rag.prompts.template import PromptTemplate as FidesPromptTemplate

_MARKER = "fides_rag_template"


def fides_rag_qa_template(template: FidesPromptTemplate | None = None) -> PromptTemplate:
    """A text-QA prompt (variables `context_str`, `query_str`) that FidesLLM decodes with fides-rag's template.

    `template`: the fides-rag PromptTemplate whose context branch other LLMs see (default: the stock one).
    FidesLLM itself renders both paths with its decoder's template.
    """
    fides = template or FidesPromptTemplate()
    text = fides.render_text("{query_str}", fides.document_block(["{context_str}"]))
    return PromptTemplate(text, prompt_type=PromptType.QUESTION_ANSWER, metadata={_MARKER: True})


def is_fides_rag_template(prompt: Any) -> bool:
    """Whether `prompt` (or the template a selector holds) came from `fides_rag_qa_template()`."""
    metadata = getattr(prompt, "metadata", None) or {}
    return bool(metadata.get(_MARKER))
