"""The tensors of the running decode: its ragged KV cache, attention mask and positions, each row's last
final-normed hidden state and captured layer states, and the row layout. Rows join at a step boundary (their
prompts are prefilled and appended) and leave after one (pruned). Shapes: R rows, W cached positions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fides_rag.generation.engine.hooks import HeadMasker, LayerCapture
from fides_rag.generation.engine.kv_cache import (
    Prefilled,
    RowGroup,
    cached_length,
    extend,
    extendable,
    left_padded,
    pad_left,
    prefill,
    prune,
)
from fides_rag.generation.engine.layout import GroupSpec, RowLayout
from fides_rag.generation.engine.pool_blocks import PromptBlocks
from fides_rag.method.lens import ModelAnatomy

if TYPE_CHECKING:
    from fides_rag.generation.engine.captured_step import CapturedStep
    from fides_rag.generation.engine.kv_pool import KVPool


class RunningBatch:
    """Rows in flight and their cache; `forward` advances every row one token, `join` appends newcomers' rows."""

    shares_prompt_blocks = False
    """Whether joining rows take their prompt's cached blocks by reference (fast mode's pool)."""

    def __init__(self, anatomy: ModelAnatomy, pad_id: int, input_device: torch.device, split_prefill: bool) -> None:
        self.anatomy = anatomy
        self.pad_id = pad_id
        self.input_device = input_device
        self.split_prefill = split_prefill
        self.layout = RowLayout()
        self.pool: KVPool | None = None
        """Fast mode's KV pool (None: exact mode's ragged cache)."""
        self.captured: CapturedStep | None = None
        """The compiled decode step (fast mode with compile), or None."""
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [R, W] bool, left-padded, width = the longest row's cached positions
        self._mask_room: torch.Tensor | None = None  # [R, W + spare] bool whose first W columns `mask` may view
        self.positions: torch.Tensor | None = None  # [R, 1] position of every row's last token
        self.hidden: torch.Tensor | None = None  # [R, H] this step's final-normed last states
        self.states: dict[int, torch.Tensor] = {}  # layer -> [R, H] this step's captured block outputs

    @property
    def empty(self) -> bool:
        return self.layout.num_rows == 0

    @property
    def extendable(self) -> bool:
        """Whether rows can join now (always when empty; else when the cache is ragged)."""
        return self.empty or extendable(self.cache)

    def forward(
        self, tokens: Sequence[int], capture: LayerCapture, masker: HeadMasker | None, bucket: int | None = None
    ) -> None:
        """One decode forward of every row over its token (`bucket`: the plan's row count, for a captured step)."""
        step_ids = torch.tensor(list(tokens), dtype=torch.long).to(self.input_device, non_blocking=True)[
            :, None
        ]  # [R, 1]
        self._grow_mask()  # [R, W + 1]
        mask, positions, _ = self._joined()
        self.positions = positions = positions[:, -1:] + 1  # [R, 1]
        self.layout.grow()
        # Rows of equal length need no attention mask: with none, transformers builds none either, with no host sync.
        unpadded = all(n == mask.shape[1] for n in self.layout.lengths)
        self.cache.padded = not unpadded
        if masker is not None:
            masker.set_rows(self.layout.row_head_sets)
        hidden, self.cache = self.anatomy.run_backbone(step_ids, None if unpadded else mask, positions, self.cache)
        self.hidden = hidden[:, -1, :]  # [R, H]
        self.states = dict(capture.states)

    def _grow_mask(self) -> None:
        """One more column of True, written in place into spare room (grown by max(16, W/16) columns at a time), so a
        step writes one column, not the whole mask."""
        mask, _, _ = self._joined()
        rows, width = mask.shape
        room = self._mask_room
        in_room = room is not None and mask.data_ptr() == room.data_ptr() and mask.stride() == room.stride()
        if room is None or not in_room or room.shape[1] <= width:
            room = mask.new_zeros((rows, width + 1 + max(16, width // 16)))
            room[:, :width] = mask
            self._mask_room = room
        room[:, width] = True
        self.mask = room[:, : width + 1]

    def _joined(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The mask, positions and last hidden states of the rows: None only while the batch is empty (they are set
        together when the first rows join, and cleared together when the last leave)."""
        if self.mask is None or self.positions is None or self.hidden is None:
            raise RuntimeError("the running batch has no rows: its mask, positions and states exist once rows join")
        return self.mask, self.positions, self.hidden

    def join(
        self, groups: Sequence[GroupSpec], head_sets: Sequence[int], capture: LayerCapture, masker: HeadMasker | None
    ) -> None:
        """Prefill newcomers' row groups and append their rows after the current ones."""
        row_groups = [
            RowGroup(*left_padded(g.sequences, self.pad_id, self.input_device), head_set=g.head_set) for g in groups
        ]
        lengths = [len(seq) for g in groups for seq in g.sequences]
        state = prefill(self.anatomy, row_groups, capture, masker, self.split_prefill, padded=len(set(lengths)) > 1)
        self.append(state, dict(capture.states), head_sets, lengths)

    def append(
        self,
        state: Prefilled,
        states: dict[int, torch.Tensor],
        head_sets: Sequence[int],
        lengths: Sequence[int],
        prompts: Sequence[PromptBlocks] | None = None,
        pinned: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Append prefilled rows (their cache, mask, last positions and states, layer -> [n, H]) after the current
        ones. `prompts`: the rows' prompt blocks, which a batch that `shares_prompt_blocks` takes by reference;
        `pinned`: the blocks such a batch held for them since their admission."""
        if self.empty:
            self.cache, self.positions, self.hidden = state.cache, state.positions, state.last_hidden
            self.mask = state.attention_mask.bool()
            self.states = states
        else:
            mask, positions, hidden = self._joined()
            extend(self.cache, state.cache)
            width = max(mask.shape[1], state.attention_mask.shape[1])
            self.mask = torch.cat(
                [
                    pad_left(mask, width, 1),
                    pad_left(state.attention_mask.to(mask.device, torch.bool), width, 1),
                ]
            )
            self.positions = torch.cat([positions, state.positions.to(positions.device)])
            self.hidden = hidden = torch.cat([hidden, state.last_hidden.to(hidden.device)])
            self.states = {
                layer: torch.cat(
                    [
                        _states(self.states, layer, hidden, self.layout.num_rows),
                        _states(states, layer, state.last_hidden, len(lengths)).to(hidden.device),
                    ]
                )
                for layer in {*self.states, *states}
            }
        self.layout.append(head_sets, lengths)

    def keep(self, rows: list[int] | None) -> None:
        """Keep only rows `rows` (in that order, repeats allowed) after the layout compacted; None: nothing moved."""
        if rows is None:
            return
        if not rows:
            self.cache = self.mask = self._mask_room = self.positions = self.hidden = None
            self.states = {}
            return
        mask, positions, _ = self._joined()
        self.mask, self.positions = prune(self.cache, mask, positions, rows)
        self.mask = self.mask[:, self.mask.shape[1] - cached_length(self.cache) :]  # columns of rows that left


def _states(states: dict[int, torch.Tensor], layer: int, like: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows, H] captured states of `layer`; zeros where these rows' forward captured none (no rule of theirs reads
    it)."""
    found = states.get(layer)
    return found if found is not None else like.new_zeros((rows, like.shape[-1]))
