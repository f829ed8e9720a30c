"""The size of fast mode's KV pool, fixed when the engine is built: from `kv_pool_tokens` (positions), from
`kv_cache_memory` (bytes, or on CUDA a fraction of the device's free memory, as vLLM's gpu_memory_utilization), or by
default from the model's shape (on CPU, DEFAULT_ROW_CONTEXTS context windows, at most DEFAULT_CPU_BYTES; on CUDA,
DEFAULT_CUDA_FRACTION of the free memory, at most `max_rows` context windows). The pool never grows: the scheduler
admits a request when the blocks of all its rows fit (`Request.kv_blocks`)."""

from __future__ import annotations

import math
from typing import Any

import torch

BLOCK = 16
"""Positions per block of the pool."""
DEFAULT_ROW_CONTEXTS = 8
"""The CPU's default pool: this many context windows of positions (at most DEFAULT_CPU_BYTES)."""
DEFAULT_CPU_BYTES = 2 << 30
DEFAULT_CUDA_FRACTION = 0.8
"""The CUDA default: this fraction of the device's free memory when the engine is built (at most max_rows windows)."""


def bytes_per_position(config: Any, dtype: torch.dtype) -> int:
    """The pool's bytes per position: keys and values of every layer."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def _positive_int(name: str, value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be None or an integer >= 1 ({what}), got {value!r}")
    return value


def pool_blocks(
    config: Any,
    dtype: torch.dtype,
    device: torch.device,
    context_window: int | None,
    max_rows: int | None,
    kv_pool_tokens: Any = None,
    kv_cache_memory: Any = None,
) -> int:
    """The blocks of BLOCK positions that rows may hold (the scratch block comes on top)."""
    if kv_pool_tokens is not None and kv_cache_memory is not None:
        raise ValueError("give at most one of kv_pool_tokens (positions) and kv_cache_memory (bytes or a fraction)")
    if kv_pool_tokens is not None:
        tokens = _positive_int("kv_pool_tokens", kv_pool_tokens, f"the fast-mode KV pool's positions, at least {BLOCK}")
        if tokens < BLOCK:
            raise ValueError(f"kv_pool_tokens must be at least one block of {BLOCK} positions, got {tokens}")
        return math.ceil(tokens / BLOCK)
    per_block = BLOCK * bytes_per_position(config, dtype)
    window = context_window or 4096
    if kv_cache_memory is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            cap = math.ceil(window / BLOCK) * (max_rows or 256)
            return max(1, min(int(free * DEFAULT_CUDA_FRACTION) // per_block - 1, cap))
        return max(1, min(DEFAULT_CPU_BYTES // per_block - 1, math.ceil(DEFAULT_ROW_CONTEXTS * window / BLOCK)))
    if isinstance(kv_cache_memory, float) and not isinstance(kv_cache_memory, bool):
        if device.type != "cuda" or not 0 < kv_cache_memory <= 1:
            raise ValueError(
                f"kv_cache_memory as a fraction must be in (0, 1] and needs a CUDA device (a share of its free "
                f"memory); give bytes (an integer) on {device.type}, got {kv_cache_memory!r}"
            )
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * kv_cache_memory)
    else:
        budget = _positive_int(
            "kv_cache_memory", kv_cache_memory, "bytes, or on CUDA a fraction in (0, 1] of free memory"
        )
    blocks = budget // per_block - 1  # less the scratch block
    if blocks < 1:
        raise ValueError(
            f"kv_cache_memory={kv_cache_memory!r} holds no block of the KV pool: one block of {BLOCK} positions "
            f"takes {per_block} bytes on this model, and the pool needs at least two (one is scratch)"
        )
    return blocks
