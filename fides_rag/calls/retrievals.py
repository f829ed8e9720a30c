"""Which retrieved texts are a call's context, when a framework ran the retriever before calling the model and did not
say: a log of the runs of one run tree (chains, tools, retrievers; each with its parent), of what each retriever
returned and of the questions it was asked, and the lookups a model run makes from its parent run.

Framework-free: a front door's callbacks feed it (langchain-fides' retriever callbacks). A retriever's texts and
query are filed under every ancestor of that retriever, since the model runs in a sibling branch; a model run walks
up from its parent and takes the texts filed under the nearest ancestor that appear verbatim in its prompt.
Everything about a run tree is dropped when its root run ends.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Sequence

MAX_DEPTH = 1000
"""The most ancestors a lookup walks up (a guard against a cycle in what a framework reported)."""


class RunRetrievals:
    """Run parentage, retrieved texts and questions per run tree (thread-safe, in memory)."""

    def __init__(self, max_runs: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._max_runs = max_runs
        self._parent: dict[Hashable, Hashable | None] = {}
        self._members: dict[Hashable, list[Hashable]] = {}
        self._root: dict[Hashable, Hashable] = {}
        self._texts: dict[Hashable, list[str]] = {}
        self._retrieved: set[Hashable] = set()
        """Runs under which a retriever ended (also with nothing) or documents were given as input."""
        self._questions: dict[Hashable, list[str]] = {}

    def _up(self, run: Hashable | None) -> Iterator[Hashable]:
        """`run` and its ancestors, nearest first (call under the lock)."""
        for _ in range(MAX_DEPTH):
            if run is None:
                return
            yield run
            run = self._parent.get(run)

    def start(self, run: Hashable, parent: Hashable | None) -> None:
        """A run started under `parent` (None: a root)."""
        with self._lock:
            if len(self._parent) > self._max_runs:  # roots that never ended (abandoned streams)
                for table in (self._parent, self._members, self._root, self._texts, self._retrieved, self._questions):
                    table.clear()
            self._parent[run] = parent
            root = self._root.get(parent, parent) if parent is not None else run
            self._root[run] = root
            self._members.setdefault(root, []).append(run)

    def end(self, run: Hashable, parent: Hashable | None) -> None:
        """A run ended; a root's end drops its whole tree."""
        if parent is not None:
            return
        with self._lock:
            for member in self._members.pop(run, [run]):
                for table in (self._parent, self._root, self._texts, self._questions):
                    table.pop(member, None)
                self._retrieved.discard(member)

    def retrieved(self, run: Hashable | None, texts: Sequence[str], *, ancestors: bool = True) -> None:
        """Texts retrieved under `run` (a retriever's parent; also none), filed under its ancestors too, or under
        `run` alone (`ancestors=False`: documents given as a run's input)."""
        with self._lock:
            for member in self._up(run) if ancestors else [run]:
                self._texts.setdefault(member, []).extend(texts)
                self._retrieved.add(member)

    def asked(self, run: Hashable | None, question: str, *, ancestors: bool = True) -> None:
        """A question asked under `run` (a retriever's query, filed under its ancestors; or a run's input question)."""
        if question.strip():
            with self._lock:
                for member in self._up(run) if ancestors else [run]:
                    self._questions.setdefault(member, []).append(question)

    def documents_for(self, run: Hashable | None, texts: Sequence[str]) -> list[str]:
        """The texts filed under the nearest ancestor of a model run (its parent `run`) that occur in any of `texts`
        (its prompt or messages), without duplicates, in retrieval order."""
        with self._lock:
            for member in self._up(run):
                found = [
                    d for d in dict.fromkeys(self._texts.get(member, ())) if d.strip() and any(d in t for t in texts)
                ]
                if found:
                    return found
        return []

    def question_for(self, run: Hashable | None, text: str) -> str | None:
        """The question of a model run: the nearest ancestor's latest question that occurs verbatim in `text`."""
        with self._lock:
            for member in self._up(run):
                for question in reversed(self._questions.get(member, ())):
                    if question.strip() in text:
                        return question.strip()
        return None

    def retrieved_for(self, run: Hashable | None) -> list[str] | None:
        """Everything retrieved under the nearest ancestor where a retriever ended (or documents were given), whether
        or not it reached the prompt, without duplicates; [] for an empty retrieval, None when no retriever ran."""
        with self._lock:
            for member in self._up(run):
                if member in self._retrieved:
                    return [d for d in dict.fromkeys(self._texts.get(member, ())) if d.strip()]
        return None
