"""Fixtures of the langchain-fides suites: a tiny random-weight decoder (fast) and a real backbone (slow)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from typing import Any

from langchain_core.callbacks import BaseCallbackHandler

from fides_rag import FidesDecoder
from fides_rag.testing import build_tiny_model, build_tokenizer

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


class Capture(BaseCallbackHandler):
    """Records streamed tokens and each run's generation_info, for assertions on what the LLM did."""

    def __init__(self) -> None:
        self.infos: list[dict[str, Any]] = []
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self.infos.append(response.generations[0][0].generation_info)
