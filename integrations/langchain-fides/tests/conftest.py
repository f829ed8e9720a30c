"""Fixtures of the langchain-fides suites: a tiny random-weight decoder (fast) and a real backbone (slow)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from fides_rag import FidesDecoder  # noqa: E402
from fides_rag.testing import build_tiny_model, build_tokenizer  # noqa: E402

_TINY: dict[str, FidesDecoder] = {}


def tiny_decoder() -> FidesDecoder:
    """One shared tiny decoder (chat-templated tokenizer, random llama)."""
    if "d" not in _TINY:
        tok = build_tokenizer(chat=True)
        _TINY["d"] = FidesDecoder(build_tiny_model("llama", len(tok)), tok, max_new_tokens=8)
    return _TINY["d"]


@pytest.fixture(scope="session")
def decoder() -> FidesDecoder:
    return tiny_decoder()
