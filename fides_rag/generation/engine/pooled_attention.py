"""One attention call per layer over every row of the running decode (fast mode), through transformers' attention
interface, over each row's own blocks of the pool (`kv_pool.py`).

Under `pooled_attention(model)`, a `PooledLayer`'s update writes the step's keys and values into the pool and returns
what attention reads; the step's masks come in as the forward's attention mask (one, or one per layer type), which
transformers hands to every layer as is. Two paths, by the pool's `attention`:
- gather: the rows' own blocks, [R, kv_heads, L, d], under a [R, 1, 1, L] mask, in one
  `scaled_dot_product_attention` (enable_gqa): its cost follows the rows' lengths, not the pool's size;
- flex: `flex_attention` over the layer's whole pool ([1, kv_heads, S, d], a batch of 1 that every query row shares)
  under a `BlockMask` that lists each row's blocks; compiled once (eager flex materialises every score).
The number of calls, and of aten ops, does not grow with the rows.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

IMPLEMENTATION = "fides_pooled"


@functools.cache
def _compiled_flex() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    # Automatic dynamic shapes: an eager step's row count changes from step to step, and one dynamic graph holds them
    # all (a static graph per count would soon pass dynamo's recompile limit, and flex would then run unfused).
    return torch.compile(flex_attention, dynamic=None)


def flex_pooled(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask: Any,
    scale: float | None,
    compiled: bool = True,
) -> torch.Tensor:
    """flex attention of R query rows ([R, heads, 1, d]) over one pool ([1, kv_heads, S, d]) under `block_mask`:
    [R, heads, 1, d]."""
    from torch.nn.attention.flex_attention import flex_attention

    run = _compiled_flex() if compiled else flex_attention
    return run(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=True)


def _pooled_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if attention_mask is None or query.shape[2] != 1:
        raise RuntimeError("pooled attention runs only in fast mode's decode step, over a pooled cache and its mask")
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        raise ValueError(
            "fast mode's pooled attention supports neither attention-logit softcapping nor attention sinks"
        )
    if isinstance(attention_mask, torch.Tensor):  # gather: key, value [R, kv_heads, L, d]; mask [R, 1, 1, L]
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
        )
    else:
        out = flex_pooled(query, key, value, attention_mask, scaling, compiled=query.device.type == "cuda")
    return out.transpose(1, 2), None  # [R, 1, heads, d]


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
