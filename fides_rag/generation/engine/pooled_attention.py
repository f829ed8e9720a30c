"""Fast mode's decode attention through transformers' attention interface: one call per layer over every row of the
running decode, over each row's own blocks of the pool (`kv_pool.py`), run by the pool's attention backend
(`attention/`).

Each pool backend registers an attention implementation of its own; under `pooled_attention(model, backend)` the
model's attention modules call it, a `PooledLayer`'s update writes the step's keys and values into the pool and
returns what the backend reads, and the step's masks come in as the forward's attention mask (one, or one per layer
type), which transformers hands to every layer as is. The number of calls, and of aten ops, does not grow with the
rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import AttentionInterface

from fides_rag.generation.engine.attention.backend import PoolAttention
from fides_rag.generation.engine.attention.implementation import attention_implementation
from fides_rag.generation.engine.attention.registry import BACKENDS


def _implementation(backend: type[PoolAttention]) -> Callable[..., tuple[torch.Tensor, None]]:
    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Any,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if attention_mask is None or query.shape[2] != 1:
            raise RuntimeError(
                "pooled attention runs only in fast mode's decode step, over a pooled cache and its mask"
            )
        if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
            raise ValueError(
                "fast mode's pooled attention supports neither attention-logit softcapping nor attention sinks"
            )
        return backend.attend(query, key, value, attention_mask, scaling).transpose(1, 2), None  # [R, 1, heads, d]

    return attention


for _backend in BACKENDS.values():
    if isinstance(_backend, type) and issubclass(_backend, PoolAttention):
        AttentionInterface.register(_backend.implementation, _implementation(_backend))


@contextlib.contextmanager
def pooled_attention(model: Any, backend: PoolAttention) -> Iterator[None]:
    """Within it, `model`'s attention runs over a pooled cache through `backend` (hold the model's lock: it switches
    the model's attention implementation for the duration)."""
    with attention_implementation(model.config, backend.implementation):
        yield
