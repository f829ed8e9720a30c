"""Attention backends: the seam between the engine's KV store and the attention call (`backend.py`), one file per
backend, chosen by name (`registry.py`)."""

from fides_rag.generation.engine.attention.backend import AttentionBackend, PoolAttention
from fides_rag.generation.engine.attention.registry import BACKENDS, attention_choices, register, resolve_attention

__all__ = ["BACKENDS", "AttentionBackend", "PoolAttention", "attention_choices", "register", "resolve_attention"]
