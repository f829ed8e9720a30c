"""The running decode: its rows' layout, the position of every row's last token, its last final-normed hidden state
and captured layer states, over a KV store (`kv_store.py`: exact mode's ragged cache or fast mode's pool). Rows join
at a step boundary (their prompts are prefilled and appended) and leave after one (kept or cleared). Shapes: R rows,
H hidden size."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch

from fides_rag.generation.engine.block_manager import PromptBlocks
from fides_rag.generation.engine.hooks import HeadMasker, LayerCapture
from fides_rag.generation.engine.kv_cache import Prefilled, RowGroup, left_padded, prefill
from fides_rag.generation.engine.kv_store import KVStore
from fides_rag.generation.engine.layout import GroupSpec, RowLayout
from fides_rag.method.lens import ModelAnatomy

if TYPE_CHECKING:
    from fides_rag.generation.engine.captured_step import CapturedStep
    from fides_rag.generation.engine.kv_pool import KVPool


class Runner:
    """Rows in flight over `store`; `forward` advances every row one token, `join` appends newcomers' rows, `keep`
    follows the layout's compaction."""

    def __init__(
        self,
        anatomy: ModelAnatomy,
        pad_id: int,
        input_device: torch.device,
        split_prefill: bool,
        store: KVStore,
        forward_context: Callable[[], Callable[[], AbstractContextManager[object]] | None] = lambda: None,
    ) -> None:
        self.anatomy = anatomy
        self.forward_context = forward_context
        """The context manager factory entered around each decode forward now (the engine's; None: none)."""
        self.pad_id = pad_id
        self.input_device = input_device
        self.split_prefill = split_prefill
        self.store = store
        self.layout = RowLayout()
        self.positions: torch.Tensor | None = None  # [R, 1] position of every row's last token
        self.hidden: torch.Tensor | None = None  # [R, H] this step's final-normed last states
        self.states: dict[int, torch.Tensor] = {}  # layer -> [R, H] this step's captured block outputs

    @property
    def pool(self) -> KVPool | None:
        """Fast mode's KV pool, once made (None: none, as in exact mode)."""
        return self.store.pool

    @property
    def captured(self) -> CapturedStep | None:
        """The compiled decode step (fast mode with compile), or None."""
        return self.store.captured

    @property
    def shares_prompt_blocks(self) -> bool:
        """Whether joining rows take their prompt's cached blocks by reference (fast mode's pool)."""
        return self.store.shares_prompt_blocks

    @property
    def empty(self) -> bool:
        return self.layout.num_rows == 0

    @property
    def extendable(self) -> bool:
        """Whether rows can join now (always when empty; else as the store says)."""
        return self.empty or self.store.extendable

    def forward(
        self, tokens: Sequence[int], capture: LayerCapture, masker: HeadMasker | None, bucket: int | None = None
    ) -> None:
        """One decode forward of every row over its token (`bucket`: the plan's row count, for a padded step)."""
        rows = len(tokens)
        bucket = self.store.bucket(rows, bucket)
        padding = (bucket or rows) - rows
        step_ids = torch.tensor([*tokens, *[self.pad_id] * padding], dtype=torch.long).to(
            self.input_device, non_blocking=True
        )[:, None]  # [Rb, 1]
        positions, _ = self._live()
        self.positions = positions = positions[:, -1:] + 1  # [R, 1]
        self.layout.grow()
        factory = self.forward_context()
        timed = factory() if factory is not None else None
        hidden = self.store.decode(step_ids, positions, self.layout, bucket, masker, timed)  # [Rb, 1, H]
        self.hidden = hidden[:rows, -1, :]  # [R, H]: padding rows dropped
        self.states = {layer: state[:rows] for layer, state in capture.states.items()}

    def _live(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' positions and last hidden states: None only while the batch is empty (they are set together when
        the first rows join, and cleared together when the last leave)."""
        if self.positions is None or self.hidden is None:
            raise RuntimeError("the running batch has no rows: its positions and states exist once rows join")
        return self.positions, self.hidden

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
        """Append prefilled rows (their cache, last positions and states, layer -> [n, H]) after the current ones.
        `prompts`: the rows' prompt blocks, which a store that `shares_prompt_blocks` takes by reference; `pinned`: the
        blocks such a store held for them since their admission."""
        self.store.append(state, lengths, prompts, pinned)
        if self.empty:
            self.positions, self.hidden, self.states = state.positions, state.last_hidden, states
        else:
            positions, hidden = self._live()
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
            self.store.clear()
            self.positions = self.hidden = None
            self.states = {}
            return
        positions, _ = self._live()
        self.positions = self.store.keep(rows, positions)


def _states(states: dict[int, torch.Tensor], layer: int, like: torch.Tensor, rows: int) -> torch.Tensor:
    """[rows, H] captured states of `layer`; zeros where these rows' forward captured none (no rule of theirs reads
    it)."""
    found = states.get(layer)
    return found if found is not None else like.new_zeros((rows, like.shape[-1]))
