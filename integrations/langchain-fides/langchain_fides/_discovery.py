"""Finding the documents that a chain retrieved before it called a FIDES model, without being told.

Importing this module registers one process-wide callback handler with langchain-core's configure
hooks (`register_configure_hook`), so every LangChain run carries it as an inheritable handler. The
handler records the parent of each chain/retriever/tool run and, when a retriever ends, files its
documents under every ancestor of that retriever. A FIDES model then walks up from its own parent
run and takes the documents filed under the nearest ancestor whose documents appear verbatim in the
prompt. Lists of `Document`s passed as a chain input (e.g. the `context` of a stuff-documents chain)
are filed the same way. Everything about a run tree is dropped when its root run ends.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.tracers.context import register_configure_hook

_MAX_TRACKED_RUNS = 100_000
QUESTION_KEYS = ("question", "input", "query")
"""Chain-input keys whose string value is taken for the question (LangChain's RAG prompts use these names)."""


model_parent_var: ContextVar[UUID | None] = ContextVar("fides_model_parent_run", default=None)
"""The parent run of the language-model run that started last in this context."""


class RetrievalRecorder(BaseCallbackHandler):
    """Records run parentage and retrieved documents per run tree (thread-safe, in-memory)."""

    run_inline = True  # record before the next step of the chain runs, also under asyncio
    raise_error = False
    ignore_agent = True
    ignore_retry = True
    ignore_custom_event = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parent: dict[UUID, UUID | None] = {}
        self._root: dict[UUID, UUID] = {}
        self._members: dict[UUID, list[UUID]] = {}
        self._documents: dict[UUID, list[Document]] = {}
        self._retrieved: set[UUID] = set()
        self._questions: dict[UUID, list[str]] = {}
        """Retriever queries and chain-input questions, filed under the run that received them."""
        """Runs under which a retriever ended (also with no documents) or Documents were given as input."""

    # -- bookkeeping ------------------------------------------------------------------------------

    def _start(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        with self._lock:
            if len(self._parent) > _MAX_TRACKED_RUNS:  # roots that never ended (abandoned streams)
                self._parent.clear(), self._root.clear(), self._members.clear(), self._documents.clear(), self._retrieved.clear()
                self._questions.clear()
            self._parent[run_id] = parent_run_id
            root = self._root.get(parent_run_id, parent_run_id) if parent_run_id is not None else run_id
            self._root[run_id] = root
            self._members.setdefault(root, []).append(run_id)

    def _end(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        if parent_run_id is not None:
            return
        with self._lock:
            for member in self._members.pop(run_id, [run_id]):
                self._parent.pop(member, None)
                self._root.pop(member, None)
                self._documents.pop(member, None)
                self._retrieved.discard(member)
                self._questions.pop(member, None)

    def _file(self, start: UUID | None, documents: list[Document]) -> None:
        with self._lock:
            run, seen = start, 0
            while run is not None and seen < 1000:
                self._documents.setdefault(run, []).extend(documents)
                self._retrieved.add(run)
                run, seen = self._parent.get(run), seen + 1

    # -- callbacks --------------------------------------------------------------------------------

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._start(run_id, parent_run_id)
        if isinstance(inputs, dict):
            for key, value in inputs.items():
                if isinstance(value, list) and value and all(isinstance(d, Document) for d in value):
                    with self._lock:
                        self._documents.setdefault(run_id, []).extend(value)
                        self._retrieved.add(run_id)
                elif key in QUESTION_KEYS and isinstance(value, str) and value.strip():
                    with self._lock:
                        self._questions.setdefault(run_id, []).append(value)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        # langchain-core's BaseChatModel.stream/astream call `_stream` without a run manager; the model
        # reads its parent run from here instead (set in the caller's context right before `_stream`).
        model_parent_var.set(parent_run_id)

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        model_parent_var.set(parent_run_id)

    def on_tool_start(self, serialized: Any, input_str: str, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._start(run_id, parent_run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._start(run_id, parent_run_id)
        if isinstance(query, str) and query.strip():
            with self._lock:  # under every ancestor, like the documents: the model runs in a sibling branch
                run, seen = parent_run_id, 0
                while run is not None and seen < 1000:
                    self._questions.setdefault(run, []).append(query)
                    run, seen = self._parent.get(run), seen + 1

    def on_retriever_end(self, documents: Sequence[Document], *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._file(parent_run_id, [d for d in documents if isinstance(d, Document)])  # an empty retrieval is recorded too
        self._end(run_id, parent_run_id)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._end(run_id, parent_run_id)

    # -- lookup -----------------------------------------------------------------------------------

    def documents_for(self, parent_run_id: UUID | None, texts: Sequence[str]) -> list[Document]:
        """Documents filed under the nearest ancestor of a model run whose contents occur in any of `texts`.

        Duplicates (same page_content) are dropped; order is retrieval order.
        """
        with self._lock:
            run, seen = parent_run_id, 0
            while run is not None and seen < 1000:
                found: list[Document] = []
                contents: set[str] = set()
                for doc in self._documents.get(run, ()):
                    content = doc.page_content
                    if content.strip() and content not in contents and any(content in t for t in texts):
                        contents.add(content)
                        found.append(doc)
                if found:
                    return found
                run, seen = self._parent.get(run), seen + 1
        return []


    def question_for(self, parent_run_id: UUID | None, text: str) -> str | None:
        """The question of a model run: the nearest ancestor's retriever query or chain-input question
        (keys `QUESTION_KEYS`) that occurs verbatim in `text`; None when there is none."""
        with self._lock:
            run, seen = parent_run_id, 0
            while run is not None and seen < 1000:
                for question in reversed(self._questions.get(run, ())):
                    if question.strip() in text:
                        return question.strip()
                run, seen = self._parent.get(run), seen + 1
        return None

    def retrieved_for(self, parent_run_id: UUID | None) -> list[Document] | None:
        """Everything retrieved under the nearest ancestor of a model run where a retriever ended (or
        Documents were given as a chain input), whether or not it reached the prompt; [] for an empty
        retrieval, None when no retriever ran above this run. Duplicates are dropped."""
        with self._lock:
            run, seen = parent_run_id, 0
            while run is not None and seen < 1000:
                if run in self._retrieved:
                    unique = {d.page_content: d for d in self._documents.get(run, ()) if d.page_content.strip()}
                    return list(unique.values())
                run, seen = self._parent.get(run), seen + 1
        return None


recorder = RetrievalRecorder()
"""The process-wide recorder; attached to every LangChain run once langchain_fides is imported."""

# A ContextVar whose *default* is the handler: `var.get()` returns it in every thread and task, so
# langchain-core's configure step adds it (inheritable) to every callback manager it builds.
fides_retrieval_recorder_var: ContextVar[RetrievalRecorder | None] = ContextVar("fides_retrieval_recorder", default=recorder)
register_configure_hook(fides_retrieval_recorder_var, inheritable=True)
