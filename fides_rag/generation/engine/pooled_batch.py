"""The running decode of fast mode: its rows' keys and values in one pool (`kv_pool.py`), attended by one call per
layer (`pooled_attention.py`). Prefill is the same as exact mode's; a request's rows move into the pool when it
joins."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fides_rag.generation.engine.captured_step import CapturedStep
from fides_rag.generation.engine.hooks import HeadMasker, LayerCapture
from fides_rag.generation.engine.kv_cache import Prefilled, RaggedLayer, mergeable
from fides_rag.generation.engine.kv_pool import Attention, KVPool, PooledCache, flex_available
from fides_rag.generation.engine.pool_blocks import PromptBlocks
from fides_rag.generation.engine.pooled_attention import pooled_attention
from fides_rag.generation.engine.running import RunningBatch, _states


def pool_attention_kind(device: torch.device) -> Attention:
    """How the pool's attention runs on `device`: flex over a BlockMask on CUDA, the gather elsewhere."""
    return "flex" if device.type == "cuda" and flex_available() else "gather"


class PooledBatch(RunningBatch):
    """`RunningBatch` over a `KVPool`: one attention call per layer for every row."""

    pool: KVPool | None = None
    captured: CapturedStep | None = None
    """The compiled decode step (`compile=True`), or None: eager."""
    pool_blocks: int = 64
    """The pool's size in blocks, fixed (the engine's, from kv_pool_tokens or kv_cache_memory)."""
    max_rows: int = 128
    """Rows the pool's persistent index buffers hold (the most a captured step runs; more run with their own)."""
    max_row_blocks: int = 512
    """Blocks one row may hold at most (the context window's)."""

    shares_prompt_blocks = True

    @property
    def extendable(self) -> bool:
        return True

    def forward(
        self, tokens: Sequence[int], capture: LayerCapture, masker: HeadMasker | None, bucket: int | None = None
    ) -> None:
        rows = len(tokens)
        if self.captured is None:
            bucket = None
        elif bucket not in self.captured.buckets or bucket < rows:  # the plan's bucket, unless rows changed since
            bucket = self.captured.bucket(rows)
        padding = (bucket or rows) - rows
        step_ids = torch.tensor([*tokens, *[self.pad_id] * padding], dtype=torch.long).to(
            self.input_device, non_blocking=True
        )[:, None]
        self.positions = self.positions + 1  # [R, 1]
        self.layout.grow()
        positions = (
            self.positions if not padding else torch.cat([self.positions, self.positions.new_zeros((padding, 1))])
        )  # [Rb, 1]
        config = self.anatomy.config
        self.pool.begin_step(positions, padded_rows=bucket)
        if masker is not None:
            masker.set_rows([*self.layout.row_head_sets, *[-1] * padding])
        mask = self.pool.attention_mask(getattr(config, "layer_types", None))
        with pooled_attention(self.anatomy.backbone):
            if bucket is not None:
                hidden = self.captured(step_ids, mask, positions, self.cache)
            else:
                hidden, self.cache = self.anatomy.run_backbone(step_ids, mask, positions, self.cache)
        self.hidden = hidden[:rows, -1, :]  # [R, H]
        self.states = {layer: state[:rows] for layer, state in capture.states.items()}

    def append(
        self,
        state: Prefilled,
        states: dict[int, torch.Tensor],
        head_sets: Sequence[int],
        lengths: Sequence[int],
        prompts: Sequence[PromptBlocks] | None = None,
    ) -> None:
        layers = state.cache.layers
        if not all(isinstance(layer, RaggedLayer) for layer in layers):
            raise TypeError("fast mode needs a model whose KV cache layers are dynamic or sliding-window ones")
        if self.empty:
            if self.pool is None:  # kept while the batch empties and fills again: one size, one captured shape
                windows = [getattr(layer.segments[0], "sliding_window", None) for layer in layers]
                like = layers[0].segments[0].keys
                attention = pool_attention_kind(like.device)
                self.pool = KVPool(windows, like, self.pool_blocks, self.max_rows, self.max_row_blocks, attention)
                self.cache = PooledCache(self.pool, self.anatomy.config)
            self.positions, self.hidden, self.states = state.positions, state.last_hidden, states
        else:
            self.positions = torch.cat([self.positions, state.positions.to(self.positions.device)])
            self.hidden = torch.cat([self.hidden, state.last_hidden.to(self.hidden.device)])
            self.states = {
                layer: torch.cat(
                    [
                        _states(self.states, layer, self.hidden, self.layout.num_rows),
                        _states(states, layer, state.last_hidden, len(lengths)).to(self.hidden.device),
                    ]
                )
                for layer in {*self.states, *states}
            }
        self.pool.add_rows(state.cache, lengths, prompts)
        self.layout.append(head_sets, lengths)

    def keep(self, rows: list[int] | None) -> None:
        if rows is None:
            return
        self.pool.keep(rows)
        if not rows:
            self.positions = self.hidden = None
            self.states = {}
            return
        self.positions = self.positions[
            torch.tensor(rows, dtype=torch.long).to(self.positions.device, non_blocking=True)
        ]


def pool_supported(config: object) -> str | None:
    """Why fast mode cannot run this model (None: it can)."""
    from fides_rag.generation.engine.kv_cache import DecodeCache

    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "its attention logits are soft-capped"
    if not mergeable(DecodeCache(config=config)):
        return "its KV cache layers are neither dynamic nor sliding-window ones"
    return None
