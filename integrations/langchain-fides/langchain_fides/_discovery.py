"""Finding the documents that a chain retrieved before it called a FIDES model, without being told: LangChain's
callbacks feed the core's run log (`fides_rag.calls.retrievals`), which says which retrieved texts are a call's context.

Importing this module registers one process-wide callback handler with langchain-core's configure hooks
(`register_configure_hook`), so every LangChain run carries it as an inheritable handler. It records the parent of
each chain/retriever/tool run, the texts each retriever returned and the query it was asked. Lists of `Document`s
passed as a chain input (e.g. the `context` of a stuff-documents chain) are recorded the same way, and so are
chain-input questions (keys `QUESTION_KEYS`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.tracers.context import register_configure_hook

from fides_rag.calls.retrievals import RunRetrievals

QUESTION_KEYS = ("question", "input", "query")
"""Chain-input keys whose string value is taken for the question (LangChain's RAG prompts use these names)."""


model_parent_var: ContextVar[UUID | None] = ContextVar("fides_model_parent_run", default=None)
"""The parent run of the language-model run that started last in this context."""


class RetrievalRecorder(RunRetrievals, BaseCallbackHandler):
    """LangChain's run callbacks into the core's run log (lookups: `documents_for`, `retrieved_for`, `question_for`)."""

    raise_error = False
    ignore_agent = True
    ignore_retry = True
    ignore_custom_event = True

    @property
    def run_inline(self) -> bool:  # type: ignore[override]  # a property over the base's class attribute: read only
        """Inline (record before the next step of the chain runs, in the caller's context, also under asyncio), but
        for a completion model's start under asyncio: there langchain-core's `AsyncCallbackManager.on_llm_start`
        calls the other handlers (`astream_events`' among them) only when no handler is inline. A completion model's
        start needs no recording (the model reads its parent run from its run manager)."""
        caller = sys._getframe(1)
        while caller.f_back is not None and caller.f_code.co_name.startswith("<"):  # a comprehension's own frame
            caller = caller.f_back
        return caller.f_code.co_name != "on_llm_start"

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self.start(run_id, parent_run_id)
        for key, value in inputs.items() if isinstance(inputs, dict) else ():
            if isinstance(value, list) and value and all(isinstance(d, Document) for d in value):
                self.retrieved(run_id, [d.page_content for d in value], ancestors=False)
            elif key in QUESTION_KEYS and isinstance(value, str):
                self.asked(run_id, value, ancestors=False)

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        # langchain-core's BaseChatModel.stream/astream call `_stream` without a run manager; the model
        # reads its parent run from here instead (set in the caller's context right before `_stream`).
        model_parent_var.set(parent_run_id)

    on_llm_start = on_chat_model_start  # type: ignore[assignment]  # only the parent run is read, from either start

    def on_tool_start(
        self, serialized: Any, input_str: str, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self.start(run_id, parent_run_id)

    def on_retriever_start(
        self, serialized: Any, query: str, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self.start(run_id, parent_run_id)
        if isinstance(query, str):
            self.asked(parent_run_id, query)  # under every ancestor, like the texts: the model runs in a sibling branch

    def _run_ended(self, outcome: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """A chain, tool or retriever run ended (its outputs or its error)."""
        self.end(run_id, parent_run_id)

    # One handler for five events: only the run ids are read, never the outputs or the error.
    on_chain_end = on_chain_error = on_tool_end = on_tool_error = on_retriever_error = _run_ended  # type: ignore[assignment]

    def on_retriever_end(
        self, documents: Sequence[Document], *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self.retrieved(
            parent_run_id, [d.page_content for d in documents if isinstance(d, Document)]
        )  # also an empty retrieval
        self.end(run_id, parent_run_id)


recorder = RetrievalRecorder()
"""The process-wide recorder; attached to every LangChain run once langchain_fides is imported."""

# A ContextVar whose *default* is the handler: `var.get()` returns it in every thread and task, so
# langchain-core's configure step adds it (inheritable) to every callback manager it builds.
fides_retrieval_recorder_var: ContextVar[RetrievalRecorder | None] = ContextVar(
    "fides_retrieval_recorder", default=recorder
)
register_configure_hook(fides_retrieval_recorder_var, inheritable=True)
