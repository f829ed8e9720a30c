"""Fixtures for the core suite; the factories live in fides_rag.testing."""

from __future__ import annotations

import pytest

from fides_rag.testing import FAMILIES, build_tiny_model, build_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def chat_tokenizer():
    return build_tokenizer(chat=True)


@pytest.fixture(scope="session")
def tiny_models(tokenizer):
    """family -> tiny random-weight model (shared; tests must not modify it)."""
    return {family: build_tiny_model(family, len(tokenizer)) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models):
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def tiny_gemma3(tiny_models):
    return tiny_models["gemma3_text"]
