"""Demo corpora: the small hand-written corpus shipped with the package, and PopQA long-tail.

A corpus is a list of questions (with gold aliases) and a list of passages to retrieve from; every
passage is also a candidate distractor for the questions whose gold aliases it does not contain.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from fides_rag.demo.metrics import contains_alias
from fides_rag.eval.datasets import DATA_ENV, QAExample, data_dir, load_popqa

EMBEDDED_CORPUS = "demo_corpus.json"
POPQA_QUESTIONS = "popqa_longtail.jsonl"
POPQA_PASSAGES = "popqa_longtail_passages.txt"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])")


@dataclass(frozen=True)
class Passage:
    """A retrievable passage: its id and its text."""

    id: str
    text: str


def corpus_question(
    ident: str,
    question: str,
    answers: tuple[str, ...],
    kind: str = "",
    memory_answers: tuple[str, ...] = (),
    answer_passages: tuple[str, ...] = (),
) -> QAExample:
    """A corpus question as the common example type, before retrieval (no passages yet).

    meta["kind"]: embedded corpus: counterfactual, longtail or factual; PopQA: the relation (prop).
    meta["answer_passages"]: ids of the corpus passages holding a gold alias. memory_answers: for counterfactual
    questions, the real-world answer a model may have memorised.
    """
    return QAExample(question, (), answers, memory_answers, ident, {"kind": kind, "answer_passages": answer_passages})


@dataclass
class Corpus:
    name: str
    questions: list[QAExample]
    passages: list[Passage]
    source: str = "embedded"
    """Where it was read from: 'embedded' or a folder."""
    meta: dict = field(default_factory=dict)

    def content_hash(self) -> str:
        """SHA-256 of the passage texts in order (what the embedding cache is keyed by)."""
        digest = hashlib.sha256()
        for passage in self.passages:
            digest.update(passage.text.encode("utf-8"))
            digest.update(b"\0")
        return digest.hexdigest()

    def describe(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "questions": len(self.questions),
            "passages": len(self.passages),
            "passages_sha256": self.content_hash(),
            **self.meta,
        }


def split_passage(text: str, max_words: int = 60) -> list[str]:
    """Split a retrieved-knowledge text into passages: strip a leading '#', cut into sentences, and
    pack consecutive sentences into chunks of at most `max_words` words (a longer sentence is its own chunk)."""
    if max_words <= 0:
        raise ValueError(f"max_words must be positive, got {max_words}")
    text = " ".join(text.strip().lstrip("#").split())
    if not text:
        return []
    chunks: list[str] = []
    current: list[str] = []
    words = 0
    for sentence in _SENTENCE_END.split(text):
        n = len(sentence.split())
        if current and words + n > max_words:
            chunks.append(" ".join(current))
            current, words = [], 0
        current.append(sentence)
        words += n
    if current:
        chunks.append(" ".join(current))
    return chunks


def load_embedded_corpus() -> Corpus:
    """The hand-written demo corpus shipped inside the package (fides_rag/demo/data/demo_corpus.json)."""
    raw = json.loads(
        resources.files("fides_rag.demo").joinpath("data").joinpath(EMBEDDED_CORPUS).read_text(encoding="utf-8")
    )
    questions = [
        corpus_question(
            q["id"],
            q["question"],
            tuple(q["answers"]),
            q.get("kind", ""),
            tuple(q.get("memory_answers", ())),
            tuple(q.get("answer_passages", ())),
        )
        for q in raw["questions"]
    ]
    passages = [Passage(p["id"], p["text"]) for p in raw["passages"]]
    return Corpus(raw["name"], questions, passages, "embedded", {"description": raw.get("description", "")})


def default_popqa_folder() -> Path:
    """$FIDES_RAG_DATA/popqa, else ../shared/data/popqa beside the repository checkout."""
    return data_dir() / "popqa"


def resolve_popqa_folder(data: str | os.PathLike | None = None) -> Path:
    """The folder holding the PopQA long-tail files: `data` (or its popqa/ subfolder), else the default.

    Raises FileNotFoundError naming every place it looked."""
    if data is not None:
        base = Path(data).expanduser()
        candidates = [base, base / "popqa"]
    else:
        candidates = [default_popqa_folder()]
    for folder in candidates:
        if (folder / POPQA_QUESTIONS).is_file() and (folder / POPQA_PASSAGES).is_file():
            return folder
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"PopQA long-tail data not found: looked for {POPQA_QUESTIONS} and {POPQA_PASSAGES} in {looked}. "
        f"Pass --data FOLDER or set ${DATA_ENV} to a folder with a popqa/ subfolder; "
        f"or run without --data/--corpus popqa for the embedded demo corpus."
    )


def load_popqa_corpus(data: str | os.PathLike | None = None, max_words: int = 60) -> Corpus:
    """PopQA long-tail: the questions and aliases, and every line of the passages file split into
    passages (duplicate texts kept once). Line i of the passages file belongs to question i."""
    folder = resolve_popqa_folder(data)
    examples = load_popqa(folder / POPQA_QUESTIONS, folder / POPQA_PASSAGES)  # the one PopQA reader, eval's
    passages: list[Passage] = []
    seen: dict[str, str] = {}
    questions: list[QAExample] = []
    for i, example in enumerate(examples):
        answers = example.context_answers
        own: list[str] = []
        for j, text in enumerate(split_passage(example.contexts[0], max_words)):
            pid = seen.get(text)
            if pid is None:
                pid = seen[text] = f"popqa-{i}-{j}"
                passages.append(Passage(pid, text))
            if contains_alias(text, answers):
                own.append(pid)
        questions.append(
            corpus_question(
                f"popqa-{example.meta['question_id']}",
                example.question,
                answers,
                example.meta.get("prop") or "",
                (),
                tuple(own),
            )
        )
    return Corpus("popqa-longtail", questions, passages, str(folder), {"max_words": max_words})
