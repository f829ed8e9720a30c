"""`gather`: fast mode's attention on the CPU (and wherever flex attention is missing). Every row's blocks are
gathered by slot into one padded [R, kv_heads, L, d] tensor (L: the longest row's blocks) and attended under a
[R, 1, 1, L] mask by one `scaled_dot_product_attention` (enable_gqa): its cost follows the rows' lengths, not the
pool's size."""

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
        self.slots: torch.Tensor | None = None
        """[Rb * L] this step's slots of every row, in row order."""
        self.rows = 0
        self._masks: list[torch.Tensor] = []

    def bind(self, pool: Any) -> None:
        super().bind(pool)
        self._arange = torch.arange(BLOCK, device=pool.device)

    def begin_step(self, index: torch.Tensor, width: int) -> dict[Window, Any]:
        pool = self.pool
        full = pool.regions["full"]
        blocks = index[:, full : full + width].long()  # [Rb, W]
        self.slots = (blocks[:, :, None] * BLOCK + self._arange).reshape(-1)  # [Rb * W * BLOCK]
        self.rows = index.shape[0]
        key_positions = torch.arange(width * BLOCK, device=pool.device)[None]  # [1, L]
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
        if self.slots is None:
            return []
        return [(self.slots, 0), *((mask, 3) for mask in self._masks)]

    def read(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slots is None:
            raise RuntimeError("read before begin_step")
        shape = (self.pool.kv_heads, self.rows, -1, self.pool.head_dim)
        return (
            keys.index_select(2, self.slots).view(shape).transpose(0, 1),
            values.index_select(2, self.slots).view(shape).transpose(0, 1),
        )  # [Rb, kv_heads, L, d] each

    @staticmethod
    def attend(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, scale: float | None
    ) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1]
        )
