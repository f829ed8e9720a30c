"""Exact mode's KV store: the rows' ragged KV cache (`kv_cache.py`) and their left-padded attention mask. Rows of
equal length need no mask. Shapes: R rows, W cached positions."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from fides_rag.generation.engine.block_manager import PromptBlocks
from fides_rag.generation.engine.hooks import HeadMasker
from fides_rag.generation.engine.kv_cache import Prefilled, cached_length, extend, extendable, pad_left, prune
from fides_rag.generation.engine.layout import RowLayout
from fides_rag.method.lens import ModelAnatomy

if TYPE_CHECKING:
    from fides_rag.generation.engine.captured_step import CapturedStep
    from fides_rag.generation.engine.kv_pool import KVPool


class RaggedStore:
    """The ragged cache and mask of the rows in flight (`KVStore`); both exist exactly while rows do."""

    def __init__(self, anatomy: ModelAnatomy) -> None:
        self.anatomy = anatomy
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [R, W] bool, left-padded, width = the longest row's cached positions
        self._mask_room: torch.Tensor | None = None  # [R, W + spare] bool whose first W columns `mask` may view

    @property
    def pool(self) -> KVPool | None:
        return None

    @property
    def captured(self) -> CapturedStep | None:
        return None

    @property
    def shares_prompt_blocks(self) -> bool:
        return False

    @property
    def extendable(self) -> bool:
        """Whether rows can join (when the cache is ragged)."""
        return extendable(self.cache)

    def bucket(self, rows: int, planned: int | None) -> int | None:
        """Never padded: every step runs at its own row count."""
        return None

    def decode(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        layout: RowLayout,
        bucket: int | None,
        masker: HeadMasker | None,
        timed: AbstractContextManager[object] | None = None,
    ) -> torch.Tensor:
        self._grow_mask()  # [R, W + 1]
        mask = self._mask()
        # Rows of equal length need no attention mask: with none, transformers builds none either, with no host sync.
        unpadded = all(n == mask.shape[1] for n in layout.lengths)
        self.cache.padded = not unpadded
        if masker is not None:
            masker.set_rows(layout.row_head_sets)
        with timed or contextlib.nullcontext():
            hidden, self.cache = self.anatomy.run_backbone(ids, None if unpadded else mask, positions, self.cache)
        return hidden

    def _grow_mask(self) -> None:
        """One more column of True, written in place into spare room (grown by max(16, W/16) columns at a time), so a
        step writes one column, not the whole mask."""
        mask = self._mask()
        rows, width = mask.shape
        room = self._mask_room
        in_room = room is not None and mask.data_ptr() == room.data_ptr() and mask.stride() == room.stride()
        if room is None or not in_room or room.shape[1] <= width:
            room = mask.new_zeros((rows, width + 1 + max(16, width // 16)))
            room[:, :width] = mask
            self._mask_room = room
        room[:, width] = True
        self.mask = room[:, : width + 1]

    def _mask(self) -> torch.Tensor:
        """The rows' mask: None only while no rows are held (it is set when the first rows join, and cleared when the
        last leave)."""
        if self.mask is None:
            raise RuntimeError("the running batch has no rows: its mask exists once rows join")
        return self.mask

    def append(
        self,
        state: Prefilled,
        lengths: Sequence[int],
        prompts: Sequence[PromptBlocks] | None,
        pinned: Sequence[Sequence[int]] | None,
    ) -> None:
        """The rows' cache joins the held one, their mask is padded to the wider of the two (prompt blocks are not
        shared: `prompts` and `pinned` are unused)."""
        if self.mask is None:
            self.cache = state.cache
            self.mask = state.attention_mask.bool()
            return
        mask = self.mask
        extend(self.cache, state.cache)
        width = max(mask.shape[1], state.attention_mask.shape[1])
        self.mask = torch.cat(
            [
                pad_left(mask, width, 1),
                pad_left(state.attention_mask.to(mask.device, torch.bool), width, 1),
            ]
        )

    def keep(self, rows: list[int], positions: torch.Tensor) -> torch.Tensor:
        """The cache, mask and positions of rows `rows` (one index for mask and positions); the mask loses the
        columns only rows that left had."""
        self.mask, positions = prune(self.cache, self._mask(), positions, rows)
        self.mask = self.mask[:, self.mask.shape[1] - cached_length(self.cache) :]  # columns of rows that left
        return positions

    def clear(self) -> None:
        self.cache = self.mask = self._mask_room = None
