"""A prompt that keeps the question and the documents apart, so FIDES can build both of its paths.

LangChain flattens prompts to strings before an LLM sees them; `FidesPromptValue` survives that
because FidesLLM and ChatFides intercept it in invoke/stream/batch (and the async forms) and decode
with fides-rag's own tuned two-path template. Any other model sees an ordinary prompt.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.prompt_values import StringPromptValue
from langchain_core.runnables import RunnableLambda
from pydantic import Field, model_validator

from fides_rag.prompts.template import PromptTemplate, document_texts

_TEMPLATE = PromptTemplate()


class FidesPromptValue(StringPromptValue):
    """A question plus its documents; `text` is a readable single-path rendering for other models."""

    type: Literal["FidesPromptValue"] = "FidesPromptValue"  # type: ignore[assignment]
    question: str
    """The user's question, without the documents."""
    documents: list[str] = Field(default_factory=list)
    """The document texts (Documents and strings are accepted and turned into their text)."""
    text: str = ""
    """The context-path prompt as one string (filled in from question and documents when empty)."""

    @model_validator(mode="before")
    @classmethod
    def _texts(cls, values: Any) -> Any:
        if isinstance(values, dict) and "documents" in values:
            values = {**values, "documents": document_texts(values["documents"])}
        return values

    @model_validator(mode="after")
    def _render(self) -> FidesPromptValue:
        if not self.text:
            if self.documents:
                body = _TEMPLATE.context_turn(self.question, _TEMPLATE.document_block(self.documents))
            else:
                body = _TEMPLATE.no_context_turn(self.question)
            self.text = f"{body}\n{_TEMPLATE.answer_prefix}"
        return self

    def to_messages(self) -> list[BaseMessage]:
        return [
            HumanMessage(
                content=self.text,
                additional_kwargs={"documents": list(self.documents), "fides_question": self.question},
            )
        ]


def fides_rag_prompt(question_key: str | None = None, documents_key: str | None = None) -> RunnableLambda:
    """A prompt step for RAG chains:
    `{"context": retriever, "question": RunnablePassthrough()} | fides_rag_prompt() | llm`.

    Takes a dict and returns a FidesPromptValue. The question is read from `question_key` (default:
    "question", else "input"), the documents from `documents_key` (default: "context", else
    "documents"): a list of Documents or strings, or one string.
    """

    def build(inputs: Any) -> FidesPromptValue:
        if isinstance(inputs, str):
            return FidesPromptValue(question=inputs)
        if not isinstance(inputs, dict):
            raise TypeError(
                f"fides_rag_prompt expects a dict with a question and documents, got {type(inputs).__name__}"
            )
        qkey = question_key or next((k for k in ("question", "input", "query") if k in inputs), None)
        dkey = documents_key or next((k for k in ("context", "documents") if k in inputs), None)
        if qkey is None or qkey not in inputs:
            raise ValueError(f"fides_rag_prompt: no question in the input keys {sorted(inputs)}; pass question_key=")
        docs = inputs.get(dkey) if dkey is not None else None
        return FidesPromptValue(question=str(inputs[qkey]), documents=docs if docs is not None else [])

    return RunnableLambda(build, name="fides_rag_prompt")
