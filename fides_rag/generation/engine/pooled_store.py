"""Fast mode's KV store: the rows' keys and values in one pool (`kv_pool.py`), attended by one call per layer
(`pooled_attention.py`), a step padded to a bucket where the backend needs a static batch or the step is captured.
Prefill is the same as exact mode's; a request's rows move into the pool when it joins."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from fides_rag.generation.engine.attention.backend import PoolAttention
from fides_rag.generation.engine.attention.registry import BACKENDS
from fides_rag.generation.engine.block_manager import BlockManager, PromptBlocks
from fides_rag.generation.engine.captured_step import CapturedStep, bucket_for
from fides_rag.generation.engine.hooks import HeadMasker
from fides_rag.generation.engine.kv_cache import Prefilled, RaggedLayer, mergeable
from fides_rag.generation.engine.kv_pool import KVPool, PooledCache
from fides_rag.generation.engine.layout import RowLayout
from fides_rag.generation.engine.pooled_attention import pooled_attention
from fides_rag.method.lens import ModelAnatomy


@dataclass(frozen=True)
class PoolSettings:
    """The engine's choices for fast mode's pool, fixed for its life."""

    max_rows: int
    """Rows one step may hold (the persistent index buffers' size)."""
    max_row_blocks: int
    """Blocks one row may hold at most (the context window's)."""
    attention: str
    """The pool's attention backend (`attention/registry.py`)."""
    buckets: tuple[int, ...]
    """Row counts a step is padded to, where the backend needs a static batch or the step is captured."""
    captured: CapturedStep | None = None
    """The compiled decode step (`compile=True`), or None: eager."""

    def bucket(self, rows: int) -> int:
        """The smallest bucket that holds `rows` rows (raises past the largest: max_rows caps them)."""
        return bucket_for(rows, self.buckets)


class PooledStore:
    """The rows' keys and values in a `KVPool` (`KVStore`): one attention call per layer for every row. The pool is
    made when the first rows join, then kept while the batch empties; its blocks are `block_manager`'s (the
    scheduler's), reset here: a new store starts from an empty pool."""

    def __init__(self, anatomy: ModelAnatomy, settings: PoolSettings, block_manager: BlockManager) -> None:
        self.anatomy = anatomy
        self.settings = settings
        self.block_manager = block_manager
        block_manager.reset()
        self._pool: KVPool | None = None
        self.cache: Any = None  # the pool's `PooledCache`, once the pool is made
        backend = BACKENDS[settings.attention]()
        if not isinstance(backend, PoolAttention):
            raise ValueError(f"attention={settings.attention!r} does not attend over fast mode's pool")
        self.attention: PoolAttention = backend

    @property
    def pool(self) -> KVPool | None:
        return self._pool

    @property
    def captured(self) -> CapturedStep | None:
        return self.settings.captured

    @property
    def shares_prompt_blocks(self) -> bool:
        return True

    @property
    def extendable(self) -> bool:
        """Always: rows join the pool at any step."""
        return True

    def _live(self) -> KVPool:
        """The pool, once rows have joined."""
        if self._pool is None:
            raise RuntimeError("the running batch has no rows: rows join (append) before a decode step")
        return self._pool

    def bucket(self, rows: int, planned: int | None) -> int | None:
        """The row count this step runs at: the plan's bucket, unless rows changed since; a bucket whenever the
        backend needs a static batch (every row count is covered: the engine checks max_rows against the buckets);
        on a captured step past its largest bucket, None (the step runs eagerly, unpadded)."""
        captured = self.captured
        if captured is None and not self.attention.static_batch:
            return None
        if planned in self.settings.buckets and planned >= rows:
            return planned
        if self.attention.static_batch:
            return self.settings.bucket(rows)
        return captured.bucket(rows) if captured is not None else None

    def decode(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        layout: RowLayout,
        bucket: int | None,
        masker: HeadMasker | None,
        timed: AbstractContextManager[object] | None = None,
    ) -> torch.Tensor:
        """Padding rows (past R, up to `bucket`) are at position 0, with no head set: they write and read the pool's
        scratch block only."""
        pool = self._live()
        padding = ids.shape[0] - positions.shape[0]
        if padding:
            positions = torch.cat([positions, positions.new_zeros((padding, 1))])  # [Rb, 1]
        config = self.anatomy.config
        pool.begin_step(positions, padded_rows=bucket)
        if masker is not None:
            masker.set_rows([*layout.row_head_sets, *[-1] * padding])
        mask = pool.attention_mask(getattr(config, "layer_types", None))
        captured = self.captured
        with pooled_attention(self.anatomy.backbone, self.attention), timed or contextlib.nullcontext():
            if captured is not None and bucket is not None:
                hidden = captured(ids, mask, positions, self.cache)
            else:
                hidden, self.cache = self.anatomy.run_backbone(ids, mask, positions, self.cache)
        return hidden

    def append(
        self,
        state: Prefilled,
        lengths: Sequence[int],
        prompts: Sequence[PromptBlocks] | None,
        pinned: Sequence[Sequence[int]] | None,
    ) -> None:
        """The rows' keys and values are copied into the pool, or take `prompts`' kept blocks by reference (`pinned`:
        the blocks held for them since their admission)."""
        layers = state.cache.layers
        if not all(isinstance(layer, RaggedLayer) for layer in layers):
            raise TypeError("fast mode needs a model whose KV cache layers are dynamic or sliding-window ones")
        if self._pool is None:
            windows = [getattr(layer.segments[0], "sliding_window", None) for layer in layers]
            like = layers[0].segments[0].keys
            s = self.settings
            self._pool = KVPool(windows, like, self.block_manager, s.max_rows, s.max_row_blocks, self.attention)
            self.cache = PooledCache(self._pool, self.anatomy.config)
        self._pool.add_rows(state.cache, lengths, prompts, pinned)

    def keep(self, rows: list[int], positions: torch.Tensor) -> torch.Tensor:
        """The pool keeps rows `rows` (a repeated row shares its blocks); returns their positions."""
        self._live().keep(rows)
        return positions[torch.tensor(rows, dtype=torch.long).to(positions.device, non_blocking=True)]

    def clear(self) -> None:
        """Every row's blocks go back to the pool (which stays, for the next rows)."""
        self._live().keep([])


def pool_supported(config: object) -> str | None:
    """Why fast mode cannot run this model (None: it can)."""
    from fides_rag.generation.engine.kv_cache import DecodeCache

    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "its attention logits are soft-capped"
    if not mergeable(DecodeCache(config=config)):
        return "its KV cache layers are neither dynamic nor sliding-window ones"
    return None
