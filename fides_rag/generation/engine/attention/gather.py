"""`gather`: fast mode's attention on the CPU (and wherever flex attention is missing). Every row's blocks are
gathered, a block at a time, into one padded [R, kv_heads, L, d] tensor (L: the longest row's blocks) and attended
under a [R, 1, 1, L] mask by one `scaled_dot_product_attention` (enable_gqa): its cost follows the rows' lengths, not
the pool's size."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fides_rag.generation.engine.attention.backend import PoolAttention, Window
from fides_rag.generation.engine.kv_pool_size import BLOCK
from fides_rag.generation.engine.pool_index import POS


class GatherAttention(PoolAttention):
    name = "gather"
    implementation = "fides_pool_gather"

    def __init__(self) -> None:
        self.block_ids: torch.Tensor | None = None
        """[Rb, W] this step's blocks of every row (W: the longest row's blocks)."""
        self._masks: list[torch.Tensor] = []

    def bind(self, pool: Any) -> None:
        super().bind(pool)
        self._key_positions = torch.arange(pool.max_row_blocks * BLOCK, device=pool.device)[None]  # [1, most L]

    def begin_step(self, index: torch.Tensor, width: int) -> dict[Window, Any]:
        pool = self.pool
        full = pool.regions["full"]
        self.block_ids = index[:, full : full + width].long()  # [Rb, W]
        key_positions = self._key_positions[:, : width * BLOCK]  # [1, L]
        row_length = index[:, POS : POS + 1].long() + 1  # [Rb, 1]
        masks: dict[Window, Any] = {}
        for window in {*pool.windows}:
            visible = key_positions < row_length
            if window is not None:
                visible = visible & (key_positions >= row_length - window)
            masks[window] = visible[:, None, None, :]  # [Rb, 1, 1, L]
        self._masks = list(masks.values())
        return masks

    def dynamic_dims(self) -> list[tuple[torch.Tensor, int]]:
        """The rows' blocks and the masks' width, and (no static batch) their rows: one graph serves every bucket
        past 1 and every prompt length."""
        if self.block_ids is None:
            return []
        return [
            (self.block_ids, 0),
            (self.block_ids, 1),
            *((mask, 0) for mask in self._masks),
            *((mask, 3) for mask in self._masks),
        ]

    def read(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's blocks, copied a block (BLOCK positions of every KV head) at a time: one index per block, not
        per position."""
        if self.block_ids is None:
            raise RuntimeError("read before begin_step")
        kv_heads, d = self.pool.kv_heads, self.pool.head_dim
        blocked = (kv_heads, -1, BLOCK, d)  # the pool's [1, kv_heads, S, d] as [kv_heads, blocks, BLOCK, d]
        shape = (kv_heads, self.block_ids.shape[0], -1, d)  # the rows from a shape: symbolic in a graph
        ids = self.block_ids.reshape(-1)
        return (
            keys.view(blocked).index_select(1, ids).view(shape).transpose(0, 1),
            values.view(blocked).index_select(1, ids).view(shape).transpose(0, 1),
        )  # [Rb, kv_heads, L, d] each

    @staticmethod
    def attend(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, scale: float | None
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1]
        )
