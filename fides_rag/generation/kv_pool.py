"""The KV pool of fast mode: every layer's keys and values of every row in one tensor, so one attention call per
layer serves every row of every request and path.

The pool is cut into blocks of `BLOCK` positions. Each row owns a list of blocks (its block table, on the host); a
row's position p lives at slot `table[p // BLOCK] * BLOCK + p % BLOCK` of every layer. Two device tensors say
what each slot holds: the row that owns it (-1: free) and its position. A decode step writes one slot per row per
layer (`index_copy_`: bytes flat in the context) and builds one mask per attention window, [R * groups, S], that
lets each row's queries see its own slots only (and, in a sliding-window layer, only those within the window).

Rows that leave give their blocks back; rows that repeat (several units of a request taking copies of a shared
row) get new blocks with a copy of the row's slots. The pool doubles when it runs out of blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicCache

from fides_rag.generation.kv_cache import RaggedLayer

BLOCK = 16
"""Positions per block."""
MIN_BLOCKS = 64
SCRATCH = 0
"""The slot that padding rows of a captured step write and read (block 0 is never given to a row)."""


class KVPool:
    """Keys and values of every layer, [1, kv_heads, S, d] each, and the slots' owners and positions."""

    def __init__(self, windows: Sequence[int | None], like: torch.Tensor, min_positions: int = MIN_BLOCKS * BLOCK) -> None:
        self.windows = list(windows)
        """Per layer: its sliding window, or None for full attention."""
        self.kv_heads, self.head_dim = like.shape[1], like.shape[-1]
        self.dtype, self.device = like.dtype, like.device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.blocks = 0
        self.min_blocks = max(2, math.ceil(min_positions / BLOCK))
        self.free: list[int] = []
        self.tables: list[list[int]] = []
        """Per row: its blocks, in position order."""
        self.lengths: list[int] = []
        """Per row: positions held."""
        self.slot_row = torch.empty(0, dtype=torch.long, device=self.device)  # [S] owner row, -1 free
        self.slot_pos = torch.empty(0, dtype=torch.long, device=self.device)  # [S] position held
        self.write_slots: torch.Tensor | None = None  # [R] this step's slot of every row
        self.masks: dict[int | None, torch.Tensor] = {}  # window -> [1, 1, R * groups, S] this step's mask

    @property
    def num_rows(self) -> int:
        return len(self.tables)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def static_tensors(self) -> list[torch.Tensor]:
        """Every tensor a decode step writes in place: each layer's keys and values."""
        return [*self.keys, *self.values]

    def _grow(self, needed: int) -> None:
        """Room for `needed` more blocks than are free (the pool doubles, at least)."""
        if len(self.free) >= needed:
            return
        blocks = max(self.min_blocks, 2 * self.blocks, self.blocks + needed - len(self.free))
        slots, old = blocks * BLOCK, self.blocks * BLOCK
        grown = []
        for tensor in (*self.keys, *self.values):
            bigger = tensor.new_zeros((1, self.kv_heads, slots, self.head_dim))
            bigger[:, :, :old] = tensor
            grown.append(bigger)
        if not grown:
            grown = [torch.zeros((1, self.kv_heads, slots, self.head_dim), dtype=self.dtype, device=self.device)
                     for _ in range(2 * len(self.windows))]
        self.keys, self.values = grown[: len(self.windows)], grown[len(self.windows) :]
        self.slot_row = torch.cat([self.slot_row, self.slot_row.new_full((slots - old,), -1)])
        self.slot_pos = torch.cat([self.slot_pos, self.slot_pos.new_zeros((slots - old,))])
        self.free += list(range(max(1, self.blocks), blocks))  # block 0 holds the scratch slot
        self.blocks = blocks

    def _take(self, count: int) -> list[int]:
        self._grow(count)
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def _slots(self, row: int, positions: range) -> list[int]:
        table = self.tables[row]
        return [table[p // BLOCK] * BLOCK + p % BLOCK for p in positions]

    def add_rows(self, cache: Any, lengths: Sequence[int]) -> None:
        """Append the rows of a prefill's ragged cache (every row's real length in `lengths`) after the current ones."""
        first = self.num_rows
        for length in lengths:
            self.tables.append(self._take(math.ceil(length / BLOCK)))
            self.lengths.append(length)
        for index, layer in enumerate(cache.layers):
            if not isinstance(layer, RaggedLayer):
                raise TypeError(f"fast mode needs a ragged prefill cache, got {type(layer).__name__} at layer {index}")
            at = first
            for segment in layer.segments:
                keys, values = segment.keys, segment.values  # [n, kv_heads, T_s, d]
                rows, width = keys.shape[0], keys.shape[-2]
                taken = [min(lengths[at - first + i], width) for i in range(rows)]
                row_index = [i for i in range(rows) for _ in range(taken[i])]
                column = [width - taken[i] + j for i in range(rows) for j in range(taken[i])]
                slots = [slot for i in range(rows)
                         for slot in self._slots(at + i, range(lengths[at - first + i] - taken[i], lengths[at - first + i]))]
                rows_t = torch.tensor(row_index, dtype=torch.long).to(self.device, non_blocking=True)
                cols_t = torch.tensor(column, dtype=torch.long).to(self.device, non_blocking=True)
                slots_t = torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True)
                self.keys[index].index_copy_(2, slots_t, keys[rows_t, :, cols_t].transpose(0, 1)[None].to(self.dtype))
                self.values[index].index_copy_(2, slots_t, values[rows_t, :, cols_t].transpose(0, 1)[None].to(self.dtype))
                at += rows
        owners = [first + r for r in range(len(lengths)) for _ in range(lengths[r])]
        positions = [p for length in lengths for p in range(length)]
        every = [s for r in range(first, self.num_rows) for s in self._slots(r, range(self.lengths[r]))]
        slots_t = torch.tensor(every, dtype=torch.long).to(self.device, non_blocking=True)
        self.slot_row[slots_t] = torch.tensor(owners, dtype=torch.long).to(self.device, non_blocking=True)
        self.slot_pos[slots_t] = torch.tensor(positions, dtype=torch.long).to(self.device, non_blocking=True)

    def begin_step(self, positions: torch.Tensor, groups: int, padded_rows: int | None = None) -> None:
        """Give every row the slot of its next position and build this step's masks. positions: [R, 1] on the device.
        With `padded_rows` (a captured step's bucket), rows past R write and see the scratch slot only."""
        slots = []
        for row, length in enumerate(self.lengths):
            if length % BLOCK == 0:
                self.tables[row] += self._take(1)
            slots.append(self.tables[row][length // BLOCK] * BLOCK + length % BLOCK)
            self.lengths[row] = length + 1
        rows = len(slots)
        padding = (padded_rows or rows) - rows
        real = torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True)
        row_ids = torch.arange(rows, device=self.device)
        self.slot_row[real] = row_ids
        self.slot_pos[real] = positions[:rows, 0]
        self.write_slots = real if not padding else torch.cat([real, real.new_full((padding,), SCRATCH)])
        query_rows = torch.arange(rows + padding, device=self.device).repeat_interleave(groups)[:, None]  # [Rb * groups, 1]
        own = self.slot_row[None, :] == query_rows  # [Rb * groups, S]: each query's row, folded as attention folds them
        if padding:
            own[rows * groups :, SCRATCH] = True
        self.masks = {}
        for window in set(self.windows):
            if window is None:
                self.masks[window] = own[None, None]
            else:
                oldest = positions.repeat_interleave(groups, dim=0) - window  # [Rb * groups, 1]
                self.masks[window] = (own & ((self.slot_pos[None, :] > oldest) | (query_rows >= rows)))[None, None]

    def attention_mask(self, layer_types: Sequence[str] | None) -> torch.Tensor | dict[str, torch.Tensor]:
        """This step's masks as a forward's attention mask: one [1, 1, R * groups, S] mask, or one per layer type."""
        if len(self.masks) == 1:
            return next(iter(self.masks.values()))
        if layer_types is None:
            raise ValueError("a model whose layers attend over different windows must name its layer_types in its config")
        return {kind: self.masks[window] for kind, window in zip(layer_types, self.windows)}

    def write(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's keys and values of every row ([R, kv_heads, 1, d]) into their slots; the layer's whole pool."""
        self.keys[layer].index_copy_(2, self.write_slots, key_states.transpose(0, 2))
        self.values[layer].index_copy_(2, self.write_slots, value_states.transpose(0, 2))
        return self.keys[layer], self.values[layer]

    def keep(self, rows: Sequence[int]) -> None:
        """Keep rows `rows` (in that order; a repeated row gets a copy of its slots in new blocks)."""
        seen: set[int] = set()
        tables, lengths, copies = [], [], []
        for new, old in enumerate(rows):
            if old in seen:
                table = self._take(len(self.tables[old]))
                copies.append((old, new, table))
            else:
                seen.add(old)
                table = self.tables[old]
            tables.append(table)
            lengths.append(self.lengths[old])
        for old in range(self.num_rows):
            if old not in seen:
                self.free += self.tables[old]
        remap = [-1] * (self.num_rows + 1)  # old row -> new row (its first kept copy); the last entry maps -1
        for new, old in enumerate(rows):
            if remap[old] < 0:
                remap[old] = new
        old_tables = self.tables
        self.tables, self.lengths = tables, lengths
        remap_t = torch.tensor(remap, dtype=torch.long).to(self.device, non_blocking=True)
        self.slot_row = remap_t[self.slot_row]  # index -1 reads the last entry: -1
        for old, new, table in copies:
            length = self.lengths[new]
            source = [old_tables[old][p // BLOCK] * BLOCK + p % BLOCK for p in range(length)]
            target = self._slots(new, range(length))
            src = torch.tensor(source, dtype=torch.long).to(self.device, non_blocking=True)
            dst = torch.tensor(target, dtype=torch.long).to(self.device, non_blocking=True)
            for tensor in (*self.keys, *self.values):
                tensor.index_copy_(2, dst, tensor.index_select(2, src))
            self.slot_row[dst] = new
            self.slot_pos[dst] = self.slot_pos[src]


class PooledLayer(CacheLayerMixin):
    """One layer's view of the pool for transformers' attention modules."""

    is_compileable = False

    def __init__(self, pool: KVPool, index: int) -> None:  # no super().__init__: the pool holds the tensors
        self.pool, self.index = pool, index
        self.is_sliding = pool.windows[index] is not None
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a PooledLayer is built from prefilled rows")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.write(self.index, key_states, value_states)

    def get_seq_length(self) -> int:
        return max(self.pool.lengths, default=0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.pool.blocks * BLOCK, 0

    def get_max_length(self) -> int:
        return -1


class PooledCache(DynamicCache):
    """The running decode's cache in fast mode: one `PooledLayer` per attention layer over one `KVPool`."""

    def __init__(self, pool: KVPool, config: Any) -> None:
        super().__init__(config=config)
        self.pool = pool
        self.layers = [PooledLayer(pool, i) for i in range(len(pool.windows))]

    def batch_select_indices(self, indices: Sequence[int]) -> None:
        self.pool.keep(list(indices))
