"""The attention-backend seam: how a decode step's attention runs over the KV store of the engine's mode.

A backend is chosen once, when the engine resolves its mode (`registry.resolve_attention`), and never probed again.
`ragged` serves exact mode's ragged cache (each group of rows attended on its own); the pool backends (`gather`,
`flex`) serve fast mode's fixed pool: the pool asks its backend for the step's masks (`begin_step`) and for what a
layer's attention reads (`read`), and the model's attention modules call the backend's `attend` through the
implementation name it registers with transformers.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import torch

Window = int | None
"""A layer's sliding window, or None for full attention."""


class PoolView(Protocol):
    """What a pool backend reads of the pool (`kv_pool.KVPool`)."""

    windows: list[Window]
    window_sizes: list[int]
    blocks: int
    max_row_blocks: int
    kv_heads: int
    head_dim: int
    device: torch.device
    index: torch.Tensor
    block_ordinal: torch.Tensor

    regions: dict[str | int, int]
    """Where each region of the packed index starts ('full', 'last', and one per window; `pool_index.py`)."""
    count_columns: dict[int | None, int]
    """The column of each window's block count (None: full attention's blocks before the last)."""


class AttentionBackend(abc.ABC):
    """One way of running a decode step's attention."""

    name: ClassVar[str]
    mode: ClassVar[str]
    """The engine mode whose KV store it attends over ('exact': ragged cache; 'fast': the pool)."""
    static_batch: ClassVar[bool] = False
    """Whether every eager step is padded to a bucket (a kernel compiled per batch size needs a static batch)."""

    @classmethod
    def unavailable(cls, device: torch.device) -> str | None:
        """Why this backend cannot run on `device` with this torch (None: it can)."""
        return None

    def describe(self) -> str:
        return self.name


class PoolAttention(AttentionBackend):
    """A backend over fast mode's pool: builds each step's masks and runs the attention call."""

    mode = "fast"
    implementation: ClassVar[str]
    """The attention implementation it registers with transformers (`pooled_attention.py` switches to it)."""
    reads_block_ordinals: ClassVar[bool] = False
    """Whether its masks read each block's place in the tables that hold it (`PoolView.block_ordinal`): the pool
    keeps those places up to date, step by step, only for a backend that reads them."""

    def bind(self, pool: PoolView) -> None:
        """Called once by the pool that owns this backend."""
        self.pool = pool

    @abc.abstractmethod
    def begin_step(self, index: torch.Tensor, width: int) -> dict[Window, Any]:
        """This step's mask per window, over the packed index `index` ([Rb, columns], on the device); `width`: the
        longest row's blocks (bucketed on a captured step)."""

    @abc.abstractmethod
    def read(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What a layer's attention reads, from the layer's pool tensors ([1, kv_heads, S, d], this step written)."""

    def dynamic_dims(self) -> list[tuple[torch.Tensor, int]]:
        """This step's tensors whose size varies with the rows' lengths, and the dimension that does: a captured step
        marks them dynamic, so one graph per bucket serves prompts of any length."""
        return []

    @staticmethod
    @abc.abstractmethod
    def attend(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Any, scale: float | None
    ) -> torch.Tensor:
        """Attention of R query rows ([R, heads, 1, d]) over what `read` returned, under this step's `mask`:
        [R, heads, 1, d]."""


AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any, float | None], torch.Tensor]
