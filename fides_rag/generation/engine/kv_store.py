"""The seam between the running decode (`runner.py`) and where its rows' keys and values live: exact mode's ragged
cache (`ragged_store.py`) or fast mode's pool (`pooled_store.py`). The runner owns what both share (the row layout,
positions, last hidden states, captured layer states); a store owns its cache, and the mask or pool that a decode
forward attends with."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import torch

from fides_rag.generation.engine.block_manager import PromptBlocks
from fides_rag.generation.engine.hooks import HeadMasker
from fides_rag.generation.engine.kv_cache import Prefilled
from fides_rag.generation.engine.layout import RowLayout

if TYPE_CHECKING:
    from fides_rag.generation.engine.captured_step import CapturedStep
    from fides_rag.generation.engine.kv_pool import KVPool


class KVStore(Protocol):
    """The rows' keys and values, and the decode forward over them. Rows are numbered as the runner's layout numbers
    them: `append` adds rows after the current ones, `keep` and `clear` follow the layout's compaction."""

    @property
    def pool(self) -> KVPool | None:
        """Fast mode's KV pool, once made (None: none, as in exact mode)."""
        ...

    @property
    def captured(self) -> CapturedStep | None:
        """The compiled decode step (fast mode with compile), or None."""
        ...

    @property
    def shares_prompt_blocks(self) -> bool:
        """Whether joining rows take their prompt's cached blocks by reference (fast mode's pool)."""
        ...

    @property
    def extendable(self) -> bool:
        """Whether rows can join the rows held now (a store that holds none always takes them)."""
        ...

    def bucket(self, rows: int, planned: int | None) -> int | None:
        """The row count a step of `rows` rows runs at (`planned`: the plan's bucket); None: `rows`, unpadded."""
        ...

    def decode(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        layout: RowLayout,
        bucket: int | None,
        masker: HeadMasker | None,
        timed: AbstractContextManager[object] | None = None,
    ) -> torch.Tensor:
        """One decode forward: `ids` [Rb, 1] (padded to `bucket` rows), `positions` [R, 1] of the rows' new tokens,
        `layout` already grown by them; `timed` is entered around the backbone's forward alone (`ForwardTimer`).
        Returns the backbone's last hidden states [Rb, 1, H]."""
        ...

    def append(
        self,
        state: Prefilled,
        lengths: Sequence[int],
        prompts: Sequence[PromptBlocks] | None,
        pinned: Sequence[Sequence[int]] | None,
    ) -> None:
        """Take prefilled rows' keys and values after the current rows (`lengths`: their cached positions; `prompts`,
        `pinned`: their prompt blocks and the blocks held for them, where the store `shares_prompt_blocks`)."""
        ...

    def keep(self, rows: list[int], positions: torch.Tensor) -> torch.Tensor:
        """Keep only rows `rows` (non-empty, in that order, repeats allowed); returns those rows of `positions`
        [R, 1]."""
        ...

    def clear(self) -> None:
        """Every row left."""
        ...
