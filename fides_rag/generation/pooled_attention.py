"""One attention call per layer over every row of the running decode (fast mode), through transformers' attention
interface.

Under `pooled_attention(model)`, a `PooledLayer`'s update writes the step's keys and values into the pool and
returns the layer's whole pool; the step's masks come in as the forward's attention mask (one 4D mask, or one per
layer type), which transformers hands to every layer as is. The attention function registered here folds the query heads that
share a key-value head into the query length ([R, heads, 1, d] -> [1, kv_heads, R * groups, d]) and runs one
`scaled_dot_product_attention` over the layer's whole pool, [1, kv_heads, S, d]: a row's queries see its own slots
only. The number of calls, and of aten ops, does not grow with the rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

IMPLEMENTATION = "fides_pooled"


def _pooled_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    if attention_mask is None or query.shape[2] != 1:
        raise RuntimeError("pooled attention runs only in fast mode's decode step, over a pooled cache and its mask")
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise ValueError("fast mode's pooled attention supports neither attention-logit softcapping nor attention sinks")
    rows, heads, length, dim = query.shape  # [R, heads, 1, d]
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    folded = query.reshape(rows, kv_heads, groups * length, dim).transpose(0, 1).reshape(1, kv_heads, rows * groups * length, dim)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask, scale=scaling)  # [1, kv_heads, R * groups, d]
    return out.reshape(kv_heads, rows, groups, dim).transpose(0, 1).reshape(rows, length, heads, dim), None


AttentionInterface.register(IMPLEMENTATION, _pooled_attention)


@contextlib.contextmanager
def pooled_attention(model: Any) -> Iterator[None]:
    """Within it, `model`'s attention runs over a pooled cache (hold the model's lock: it switches the model's
    attention implementation for the duration)."""
    config = model.config
    kind = config._attn_implementation
    config._attn_implementation = IMPLEMENTATION
    try:
        yield
    finally:
        config._attn_implementation = kind
