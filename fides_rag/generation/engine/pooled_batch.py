"""The running decode of fast mode: its rows' keys and values in one pool (`kv_pool.py`), attended by one call per
layer (`pooled_attention.py`). Prefill is the same as exact mode's; a request's rows move into the pool when it
joins."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fides_rag.generation.engine.attention.backend import PoolAttention
from fides_rag.generation.engine.attention.registry import BACKENDS
from fides_rag.generation.engine.captured_step import CapturedStep, bucket_for
from fides_rag.generation.engine.hooks import HeadMasker, LayerCapture
from fides_rag.generation.engine.kv_cache import Prefilled, RaggedLayer, mergeable
from fides_rag.generation.engine.kv_pool import KVPool, PooledCache
from fides_rag.generation.engine.pool_blocks import PromptBlocks
from fides_rag.generation.engine.pooled_attention import pooled_attention
from fides_rag.generation.engine.running import RunningBatch, _states
from fides_rag.method.lens import ModelAnatomy


@dataclass(frozen=True)
class PoolSettings:
    """The engine's choices for fast mode's pool, fixed for its life."""

    blocks: int
    """The pool's size in blocks (from kv_pool_tokens or kv_cache_memory)."""
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


class PooledBatch(RunningBatch):
    """`RunningBatch` over a `KVPool`: one attention call per layer for every row."""

    shares_prompt_blocks = True

    def __init__(
        self,
        anatomy: ModelAnatomy,
        pad_id: int,
        input_device: torch.device,
        split_prefill: bool,
        settings: PoolSettings,
    ) -> None:
        super().__init__(anatomy, pad_id, input_device, split_prefill)
        self.settings = settings
        self.captured = settings.captured  # the pool is made at the first join, then kept while the batch empties
        backend = BACKENDS[settings.attention]()
        if not isinstance(backend, PoolAttention):
            raise ValueError(f"attention={settings.attention!r} does not attend over fast mode's pool")
        self.attention: PoolAttention = backend

    @property
    def extendable(self) -> bool:
        return True

    def forward(
        self, tokens: Sequence[int], capture: LayerCapture, masker: HeadMasker | None, bucket: int | None = None
    ) -> None:
        rows = len(tokens)
        bucket = self._bucket(rows, bucket)
        padding = (bucket or rows) - rows
        step_ids = torch.tensor([*tokens, *[self.pad_id] * padding], dtype=torch.long).to(
            self.input_device, non_blocking=True
        )[:, None]
        pool, held = self._live()
        self.positions = held = held + 1  # [R, 1]
        self.layout.grow()
        positions = held if not padding else torch.cat([held, held.new_zeros((padding, 1))])  # [Rb, 1]
        config = self.anatomy.config
        pool.begin_step(positions, padded_rows=bucket)
        if masker is not None:
            masker.set_rows([*self.layout.row_head_sets, *[-1] * padding])
        mask = pool.attention_mask(getattr(config, "layer_types", None))
        with pooled_attention(self.anatomy.backbone, self.attention):
            if self.captured is not None and bucket is not None:
                hidden = self.captured(step_ids, mask, positions, self.cache)
            else:
                hidden, self.cache = self.anatomy.run_backbone(step_ids, mask, positions, self.cache)
        self.hidden = hidden[:rows, -1, :]  # [R, H]
        self.states = {layer: state[:rows] for layer, state in capture.states.items()}

    def _live(self) -> tuple[KVPool, torch.Tensor]:
        """The pool and the rows' positions, once rows have joined."""
        if self.pool is None or self.positions is None or self.hidden is None:
            raise RuntimeError("the running batch has no rows: rows join (append) before a decode step")
        return self.pool, self.positions

    def _bucket(self, rows: int, planned: int | None) -> int | None:
        """The row count this step runs at: the plan's bucket, unless rows changed since; a bucket whenever the
        backend needs a static batch (every row count is covered: the engine checks max_rows against the buckets);
        on a captured step past its largest bucket, None (the step runs eagerly, unpadded)."""
        if self.captured is None and not self.attention.static_batch:
            return None
        if planned in self.settings.buckets and planned >= rows:
            return planned
        if self.attention.static_batch:
            return self.settings.bucket(rows)
        return self.captured.bucket(rows) if self.captured is not None else None

    def append(
        self,
        state: Prefilled,
        states: dict[int, torch.Tensor],
        head_sets: Sequence[int],
        lengths: Sequence[int],
        prompts: Sequence[PromptBlocks] | None = None,
        pinned: Sequence[Sequence[int]] | None = None,
    ) -> None:
        layers = state.cache.layers
        if not all(isinstance(layer, RaggedLayer) for layer in layers):
            raise TypeError("fast mode needs a model whose KV cache layers are dynamic or sliding-window ones")
        if self.empty:
            if self.pool is None:
                windows = [getattr(layer.segments[0], "sliding_window", None) for layer in layers]
                like = layers[0].segments[0].keys
                s = self.settings
                self.pool = KVPool(windows, like, s.blocks, s.max_rows, s.max_row_blocks, self.attention)
                self.cache = PooledCache(self.pool, self.anatomy.config)
            self.positions, self.hidden, self.states = state.positions, state.last_hidden, states
        else:
            _, held = self._live()
            hidden = self.hidden
            assert hidden is not None  # checked by _live
            self.positions = torch.cat([held, state.positions.to(held.device)])
            self.hidden = torch.cat([hidden, state.last_hidden.to(hidden.device)])
            self.states = {
                layer: torch.cat(
                    [
                        _states(self.states, layer, hidden, self.layout.num_rows),
                        _states(states, layer, state.last_hidden, len(lengths)).to(hidden.device),
                    ]
                )
                for layer in {*self.states, *states}
            }
        assert self.pool is not None  # made above for the first rows
        self.pool.add_rows(state.cache, lengths, prompts, pinned)
        self.layout.append(head_sets, lengths)

    def keep(self, rows: list[int] | None) -> None:
        if rows is None:
            return
        pool, held = self._live()
        pool.keep(rows)
        if not rows:
            self.positions = self.hidden = None
            self.states = {}
            return
        self.positions = held[torch.tensor(rows, dtype=torch.long).to(held.device, non_blocking=True)]


def pool_supported(config: object) -> str | None:
    """Why fast mode cannot run this model (None: it can)."""
    from fides_rag.generation.engine.kv_cache import DecodeCache

    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "its attention logits are soft-capped"
    if not mergeable(DecodeCache(config=config)):
        return "its KV cache layers are neither dynamic nor sliding-window ones"
    return None
