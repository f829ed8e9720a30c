"""The noisy-retrieval demo (`fides-rag demo`): FAISS retrieval over a corpus, then a share of the
top-k documents swapped for irrelevant ones, answered by standard RAG, CAD, AdaCAD and FIDES.

Modules: `corpus` (the embedded demo corpus and PopQA long-tail), `retrieval` (MiniLM + FAISS with an
on-disk embedding cache), `noise` (seeded noise injection), `metrics` (alias accuracy, recall@k),
`run` (the experiment, table, plot and JSON), `cli` (the `demo` sub-command).
"""

from fides_rag.demo.corpus import (
    Corpus,
    Passage,
    corpus_question,
    load_embedded_corpus,
    load_popqa_corpus,
    split_passage,
)
from fides_rag.demo.metrics import contains_alias, is_correct, normalize_answer, recall_at_k
from fides_rag.demo.noise import inject_noise, noise_count

__all__ = [
    "Corpus",
    "Passage",
    "contains_alias",
    "corpus_question",
    "inject_noise",
    "is_correct",
    "load_embedded_corpus",
    "load_popqa_corpus",
    "noise_count",
    "normalize_answer",
    "recall_at_k",
    "split_passage",
]
