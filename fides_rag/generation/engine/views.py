"""Read-only views of the engine for the decoder's callers: its limits (the scheduler's bounds, the context window)
and its counters (what it did, what is in flight, the prefix cache). Each is a snapshot taken when it is read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DecoderLimits:
    """The bounds the decoder's engine works within (`decoder.configure` changes the scheduler's)."""

    max_requests: int | None
    """Requests decoding at once (None: no bound)."""
    max_rows: int | None
    """Batch rows (paths) decoding at once."""
    max_tokens: int | None
    """KV positions held at once (prompt plus max_new_tokens of every row)."""
    max_queue: int | None
    """Waiting requests beyond which a submission raises QueueFullError."""
    max_num_batched_tokens: int
    """The tokens one step computes: its decodes, then prefill chunks."""
    window_s: float
    """How long an idle engine waits for more arrivals before its first step."""
    admission: Literal["continuous", "static"]
    context_window: int
    """The model's context window in tokens (prompt plus new tokens)."""
    split_prefill: bool
    """Whether each prompt row is prefilled in its own forwards."""
    prefix_cache_bytes: int
    """The prefix cache's bound in bytes (0: off)."""
    prefix_block_size: int = 16
    """Tokens per block of the prefix cache."""
    mode: Literal["exact", "fast"] = "exact"
    """exact: a greedy request's tokens do not depend on what else is in flight; fast: one attention call per layer
    over every row (see docs/engine.md)."""
    attention: str = "ragged"
    """The decode step's attention backend: ragged (exact mode), gather or flex (fast mode)."""


@dataclass(frozen=True)
class DecoderStats:
    """The engine's counters since the decoder was built, and what it holds now."""

    requests: int
    finished: int
    cancelled: int
    failed: int
    steps: int
    tokens: int
    admissions: int
    """Steps at which requests joined."""
    largest_batch: int
    """Most requests decoding in one step."""
    peak_rows: int
    peak_queue: int
    prompt_tokens: int
    """Prompt tokens of every row prefilled in chunks (each path's prompt counts)."""
    prefill_tokens: int
    """Of those, the tokens computed (the rest came from the prefix cache)."""
    queue_length: int
    """Requests waiting to be admitted."""
    requests_in_flight: int
    """Requests admitted: decoding, or having their prompts prefilled."""
    rows_in_flight: int
    """Batch rows (paths) decoding now."""
    prefix_cache_hits: int
    """Prompt rows whose prefill started from a cached prefix."""
    prefix_cache_misses: int
    prefix_cache_hit_tokens: int
    """Prompt tokens taken from the cache instead of computed."""
    prefix_cache_evictions: int
    prefix_cache_entries: int
    prefix_cache_bytes: int
    """Bytes of KV states the prefix cache holds."""
    kv_pool_tokens: int = 0
    """Fast mode's KV pool: the positions it holds (fixed; 0 in exact mode)."""
    kv_pool_used_tokens: int = 0
    """Of those, the positions of the blocks rows hold now (a block rows share counts once)."""
    kv_pool_kept_tokens: int = 0
    """Of the pool's positions, those of prompt blocks kept for later rows (given back when blocks run short)."""
    kv_pool_shared_tokens: int = 0
    """Positions of the blocks rows took by reference instead of a copy, so far (prompt blocks found kept, duplicated
    rows' blocks)."""
    kv_pool_copied_on_write: int = 0
    """Shared blocks copied because a row was about to write into them, so far."""
    captured_fallback_steps: int = 0
    """Decode steps of a captured bucket that ran eagerly because its graph could not be compiled, or would have
    been recompiled after warm-up (the tokens are the same; the log says why)."""
    captured_combine_lanes: int = 0
    """Lane steps whose combine and greedy choice ran compiled with the captured step (fast mode with `compile`)."""
    captured_combine_fallbacks: int = 0
    """Lane steps that ran their combine eagerly because it could not be compiled for their rule (the log says why)."""
    warmup_s: float | None = None
    """Seconds the warm-up (`warmup=`) took to compile the captured step; None when none ran."""
