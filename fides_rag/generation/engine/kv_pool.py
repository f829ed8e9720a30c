"""The KV pool of fast mode: every layer's keys and values of every row in one tensor of fixed size, allocated once,
so one attention call per layer serves every row of every request and path.

The pool is cut into blocks of `BLOCK` positions (block 0 is scratch: padding rows of a captured step write and read
it). Each row holds a list of blocks (its block table, on the host); a row's position p lives at slot
`table[p // BLOCK] * BLOCK + p % BLOCK` of every layer. Which blocks are free, and who holds each, is the
scheduler's block manager's (`block_manager.py`), through which the pool takes and gives back blocks. Rows may hold a
block together: a joining row takes kept prompt blocks by reference, a repeated row its original's blocks, and a row
about to write into a shared block copies it first. The scheduler admits a request only when the blocks of all its
rows fit (prompt plus max_new_tokens, each row its own), so the pool never runs out and never grows.

At each decode step, `begin_step` copies every row's length and block table to the device (into persistent index
buffers): the columns the step reads only, so the bytes follow the rows' blocks, not the context window's, and of
the blocks' places only those that changed. The step writes one slot per row per layer (`index_copy_`). The pool's
attention backend (`attention/`, `gather` or `flex`) builds the step's masks from that index and says what each
layer's attention reads: each row's own blocks only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicCache

from fides_rag.generation.engine.attention.backend import PoolAttention
from fides_rag.generation.engine.attention.gather import GatherAttention
from fides_rag.generation.engine.block_manager import BlockManager, PromptBlocks
from fides_rag.generation.engine.kv_cache import RaggedLayer
from fides_rag.generation.engine.kv_pool_size import BLOCK
from fides_rag.generation.engine.pool_index import FILL, LAST, HostIndex

__all__ = ["BLOCK", "SCRATCH", "KVPool", "PooledCache", "PooledLayer"]
SCRATCH = 0
"""The block padding rows write and read (never given to a row)."""


class KVPool:
    """Keys and values of every layer, [1, kv_heads, S, d] each, of the block manager's blocks plus the scratch block,
    and the rows' block tables."""

    def __init__(
        self,
        windows: Sequence[int | None],
        like: torch.Tensor,
        block_manager: BlockManager,
        max_rows: int,
        max_row_blocks: int,
        attention: PoolAttention | None = None,
    ) -> None:
        self.windows = list(windows)
        """Per layer: its sliding window, or None for full attention."""
        self.kv_heads, self.head_dim = like.shape[1], like.shape[-1]
        self.dtype, self.device = like.dtype, like.device
        self.block_manager = block_manager
        """Free blocks, each block's holders, and the prompt blocks kept for reuse (the scheduler's)."""
        blocks = self.blocks = block_manager.blocks
        """Blocks rows may hold (the scratch block comes on top)."""
        slots = (blocks + 1) * BLOCK
        shape = (1, self.kv_heads, slots, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.windows]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.windows]
        self.tables: list[list[int]] = []
        """Per row: its blocks, in position order."""
        self.lengths: list[int] = []
        """Per row: positions held."""
        self.max_row_blocks = max(1, min(max_row_blocks, blocks + 1))
        self.max_rows = max(1, max_rows)
        self.window_sizes = sorted({w for w in self.windows if w is not None})
        total = blocks + 1
        self.columns = HostIndex.columns_for(len(self.window_sizes), self.max_row_blocks)
        self._flat = torch.zeros(total + self.max_rows * self.columns, dtype=torch.int32, device=self.device)
        """Every index buffer in one, filled by one host-to-device copy per step."""
        self.block_ordinal = self._flat[:total]
        """[blocks + 1] each block's place in the tables that hold it (kept if the backend `reads_block_ordinals`)."""
        self.index = self._flat[total:].view(self.max_rows, self.columns)
        """[rows, columns] this step's packed index (see FILL...HEAD)."""
        self._staging = torch.zeros_like(self._flat, device="cpu", pin_memory=self.device.type == "cuda")
        self._narrow = torch.zeros(self.max_rows * self.columns, dtype=torch.int32, device=self.device)
        """The read columns of this step's rows, side by side, on the device (scattered into `index` there)."""
        self._read_columns: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.index_copy_bytes = 0
        """Bytes the last step copied from the host to the index buffers."""
        self.attention: PoolAttention = attention if attention is not None else GatherAttention()
        """How each step's attention runs over the pool (`attention/`)."""
        ordinals = self._staging[:total] if self.attention.reads_block_ordinals else None
        self._host = HostIndex(self.window_sizes, self.max_row_blocks, self.max_rows, ordinals)
        """The packed index rows, kept on the host from step to step."""
        self.regions = self._host.region
        self.count_columns = self._host.num
        self.write_slots = torch.zeros(self.max_rows, dtype=torch.long, device=self.device)
        """[rows] this step's slot of every row."""
        self._arange = torch.arange(BLOCK, device=self.device)
        self.rows = 0
        """Rows of this step (with padding)."""
        self.masks: dict[int | None, Any] = {}  # window -> this step's mask (the backend's)
        self._total = total
        self.attention.bind(self)

    def static_tensors(self) -> list[torch.Tensor]:
        """Every tensor a captured decode step reads or writes in place: the pool's keys and values and the persistent
        index buffers (allocated once, never reallocated)."""
        return [*self.keys, *self.values, self._flat, self.write_slots]

    @property
    def num_rows(self) -> int:
        return len(self.tables)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @property
    def capacity_tokens(self) -> int:
        """Positions rows may hold."""
        return self.blocks * BLOCK

    @property
    def used_tokens(self) -> int:
        """Positions of the blocks rows hold now (a block several rows share counts once)."""
        return self.block_manager.held * BLOCK

    def blocks_held(self, rows: Sequence[int]) -> int:
        """Blocks rows `rows` hold (own and shared)."""
        return sum(len(self.tables[row]) for row in rows)

    def pending_copies(self) -> int:
        """Rows whose last block is shared and partly filled: each copies it before its next write."""
        return sum(
            1
            for table, length in zip(self.tables, self.lengths)
            if length % BLOCK and self.block_manager.is_shared(table[-1])
        )

    def _take(self, count: int) -> list[int]:
        return self.block_manager.take(count)

    def _slots(self, table: list[int], positions: range) -> list[int]:
        return [table[p // BLOCK] * BLOCK + p % BLOCK for p in positions]

    def _copy_in(self, slots: list[int], layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        index = torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True)
        self.keys[layer].index_copy_(2, index, keys.to(self.dtype))
        self.values[layer].index_copy_(2, index, values.to(self.dtype))

    def add_rows(
        self,
        cache: Any,
        lengths: Sequence[int],
        prompts: Sequence[PromptBlocks] | None = None,
        pinned: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Append the rows of a prefill's ragged cache (every row's real length in `lengths`) after the current ones.
        With `prompts` (per row: its prompt blocks' hashes and how many lead to a cut), a row takes the kept blocks of
        its leading blocks by reference instead of a copy, and its own prompt blocks are kept for later rows. Its
        other blocks are taken first: a pool short of them raises with nothing changed."""
        for index, layer in enumerate(cache.layers):
            if not isinstance(layer, RaggedLayer):
                raise TypeError(f"fast mode needs a ragged prefill cache, got {type(layer).__name__} at layer {index}")
        manager = self.block_manager
        shared = [manager.shared_prefix(p) for p in prompts] if prompts is not None else [[] for _ in lengths]
        for blocks in shared:  # held first: taking the other blocks may give back kept blocks nothing holds
            manager.share(blocks)
        if pinned is not None:
            manager.unpin(pinned)
        own = self._take_all([math.ceil(length / BLOCK) - len(s) for length, s in zip(lengths, shared)])
        tables = [s + o for s, o in zip(shared, own)]
        written = self._copy_rows(cache, lengths, tables, [len(s) * BLOCK for s in shared])
        start = self.num_rows
        self.tables += tables
        self.lengths += list(lengths)
        for row in range(start, self.num_rows):
            self._host.pack(row, self.tables[row], self.lengths[row])
        for i, prompt in enumerate(prompts or []):
            manager.keep_prompt(prompt, tables[i], written[i], lengths[i])

    def _copy_rows(
        self, cache: Any, lengths: Sequence[int], tables: Sequence[list[int]], skip: Sequence[int]
    ) -> list[int]:
        """Copy every row's states into its blocks, past its first `skip` positions (held by reference); returns per
        row the first position from which every layer wrote (a sliding-window layer holds only its window)."""
        written = [0] * len(lengths)
        for index, layer in enumerate(cache.layers):
            at = 0
            for segment in layer.segments:
                keys, values = segment.keys, segment.values  # [n, kv_heads, T_s, d]
                rows, width = keys.shape[0], keys.shape[-2]
                taken = [min(lengths[at + i], width, lengths[at + i] - skip[at + i]) for i in range(rows)]
                for i in range(rows):
                    written[at + i] = max(written[at + i], lengths[at + i] - min(lengths[at + i], width))
                row_index = [i for i in range(rows) for _ in range(taken[i])]
                column = [width - taken[i] + j for i in range(rows) for j in range(taken[i])]
                slots = [
                    s
                    for i in range(rows)
                    for s in self._slots(tables[at + i], range(lengths[at + i] - taken[i], lengths[at + i]))
                ]
                rows_t = torch.tensor(row_index, dtype=torch.long).to(keys.device, non_blocking=True)
                cols_t = torch.tensor(column, dtype=torch.long).to(keys.device, non_blocking=True)
                self._copy_in(
                    slots,
                    index,
                    keys[rows_t, :, cols_t].transpose(0, 1)[None],
                    values[rows_t, :, cols_t].transpose(0, 1)[None],
                )
                at += rows
        return written

    def _take_all(self, counts: Sequence[int]) -> list[list[int]]:
        taken = self._take(sum(counts))
        tables, at = [], 0
        for count in counts:
            tables.append(taken[at : at + count])
            at += count
        return tables

    def begin_step(self, positions: torch.Tensor, groups: int = 1, padded_rows: int | None = None) -> None:
        """Give every row the slot of its next position, copy this step's index to the device and build its masks.
        positions: [Rb, 1] on the device. With `padded_rows` (a captured step's bucket), rows past R write and see the
        scratch slot only."""
        rows = self.num_rows
        padded = max(padded_rows or rows, rows)
        grown = []
        for row, length in enumerate(self.lengths):
            if length % BLOCK == 0:
                self.tables[row] += self._take(1)
                grown.append(row)
            elif self.block_manager.is_shared(self.tables[row][-1]):  # about to write into a shared block: copy it
                self._copy_on_write(row)
                grown.append(row)
            self.lengths[row] = length + 1
        width = max((len(t) for t in self.tables), default=1)
        if width > self.max_row_blocks:
            raise ValueError(f"a row holds {width} blocks, more than the pool's max_row_blocks={self.max_row_blocks}")
        copied_width = min(self.max_row_blocks, 1 << (width - 1).bit_length())  # a few column sets serve every step
        if padded_rows is not None:  # a padded step: few shapes (powers of two of blocks)
            width = copied_width
        if padded > self.max_rows:
            raise RuntimeError(
                f"a step of {padded} rows, more than the pool's {self.max_rows}: the engine caps the rows it admits"
            )
        self._host.step(self.tables, self.lengths, grown)
        self._copy_index(padded, copied_width)
        index = self.index[:padded]
        torch.add(index[:, LAST].long() * BLOCK, index[:, FILL].long() - 1, out=self.write_slots[:padded])
        self.rows = padded
        self.masks = self.attention.begin_step(index, width)

    def _copy_index(self, padded: int, width: int) -> None:
        """This step's index to the device: of the `padded` rows, the columns a step of `width` blocks reads, and the
        places of the blocks that changed (only for a backend that reads them)."""
        copied = 0
        if self.attention.reads_block_ordinals:
            lo, hi = self._host.take_dirty_ordinals()
            self._flat[lo:hi].copy_(self._staging[lo:hi], non_blocking=True)
            copied += hi - lo
        rows = self._host.rows[:padded]
        if width == self.max_row_blocks:  # every column is read: one copy of the rows whole
            end = self._total + padded * self.columns
            self._staging[self._total : end].view(padded, self.columns).copy_(rows)
            self._flat[self._total : end].copy_(self._staging[self._total : end], non_blocking=True)
            self.index_copy_bytes = (copied + padded * self.columns) * 4
            return
        on_host, on_device = self._columns_read(width)
        count = padded * len(on_host)
        staged = self._staging[self._total : self._total + count].view(padded, len(on_host))
        torch.index_select(rows, 1, on_host, out=staged)
        narrow = staged
        if self.device.type != "cpu":
            narrow = self._narrow[:count].view(padded, len(on_host))
            narrow.copy_(staged, non_blocking=True)
        self.index[:padded].index_copy_(1, on_device, narrow)
        self.index_copy_bytes = (copied + count) * 4

    def _columns_read(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed index's columns a step of `width` blocks reads, on the host and on the device."""
        if width not in self._read_columns:
            columns = torch.tensor(self._host.columns_read(width), dtype=torch.long)
            self._read_columns[width] = (columns, columns.to(self.device))
        return self._read_columns[width]

    def attention_mask(self, layer_types: Sequence[str] | None) -> Any:
        """This step's masks as a forward's attention mask: one mask, or one per layer type."""
        if len(self.masks) == 1:
            return next(iter(self.masks.values()))
        if layer_types is None:
            raise ValueError(
                "a model whose layers attend over different windows must name its layer_types in its config"
            )
        return {kind: self.masks[window] for kind, window in zip(layer_types, self.windows)}

    def write(
        self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's keys and values of every row ([Rb, kv_heads, 1, d]) into their slots; what attention reads (the
        backend's: the rows' own blocks gathered, or the layer's whole pool)."""
        slots = self.write_slots[: key_states.shape[0]]  # the rows from a shape: symbolic in a graph
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(2, slots, key_states.transpose(0, 2).to(keys.dtype))
        values.index_copy_(2, slots, value_states.transpose(0, 2).to(values.dtype))
        return self.attention.read(keys, values)

    def _copy_on_write(self, row: int) -> None:
        """Row `row`'s last block, shared, replaced by a copy of its own (every layer's slots of that block)."""
        shared = self.tables[row][-1]
        (fresh,) = self._take(1)
        src, dst = shared * BLOCK + self._arange, fresh * BLOCK + self._arange  # [BLOCK] each, on the device
        for tensor in (*self.keys, *self.values):
            tensor.index_copy_(2, dst, tensor.index_select(2, src))
        self.block_manager.release([shared])
        self.block_manager.counts.copied_on_write += 1
        self.tables[row] = [*self.tables[row][:-1], fresh]

    def keep(self, rows: Sequence[int]) -> None:
        """Keep rows `rows` (in that order; a repeated row shares its blocks by reference, and copies one before it
        writes into it)."""
        kept = set(rows)
        for old in range(self.num_rows):
            if old not in kept:
                self.block_manager.release(self.tables[old])
        seen: set[int] = set()
        for old in rows:
            if old in seen:
                self.block_manager.share(self.tables[old])
            seen.add(old)
        tables = [list(self.tables[old]) for old in rows]
        self.lengths = [self.lengths[old] for old in rows]
        self.tables = tables
        self._host.keep(list(rows), [], tables, self.lengths)


class PooledLayer(CacheLayerMixin):
    """One layer's view of the pool for transformers' attention modules."""

    is_compileable = False

    def __init__(self, pool: KVPool, index: int) -> None:  # no super().__init__: the pool holds the tensors
        self.pool, self.index = pool, index
        self.is_sliding = pool.windows[index] is not None
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a PooledLayer is built from prefilled rows")

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.write(self.index, key_states, value_states)

    def get_seq_length(self) -> int:
        return max(self.pool.lengths, default=0)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.pool.blocks + 1) * BLOCK, 0

    def get_max_length(self) -> int:
        return -1


class PooledCache(DynamicCache):
    """The running decode's cache in fast mode: one `PooledLayer` per attention layer over one `KVPool`."""

    def __init__(self, pool: KVPool, config: Any) -> None:
        super().__init__(config=config)
        self.pool = pool
        self.layers = [PooledLayer(pool, i) for i in range(len(pool.windows))]

    def batch_select_indices(self, indices: Sequence[int]) -> None:  # type: ignore[override]  # host indices
        self.pool.keep(list(indices))
