"""The packed index of fast mode's decode step, kept on the host between steps.

One row per batch row, `columns` int32 entries: FILL (positions used in the last block), LAST (the last block), POS
(the position written this step), NUM_BLOCKS (the row's blocks), SELF (the row's number; PADDING_ROW for a padding
row), one count per sliding window, then regions of `max_row_blocks` block ids each: the row's blocks in order, and
per sliding window the blocks within the window.

A row holds up to `max_row_blocks` ids per region, so rebuilding every row at every step costs the host rows x
columns (64 rows of an 8B model's 128k-token window: a million entries a step). Here a row is rewritten only when its
blocks change (once every BLOCK positions) or a window moves past a block; POS and FILL of every row are set at once;
rows past the last are padding rows and stay so. With `ordinals`, it also keeps each block's place in the tables that
hold it (flex attention's mask reads it; rows sharing a block hold it at the same place).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fides_rag.generation.engine.kv_pool_size import BLOCK

FILL, LAST, POS, NUM_BLOCKS, SELF, HEAD = 0, 1, 2, 3, 4, 5
PADDING_ROW = -2
"""The SELF of padding rows."""


class HostIndex:
    """The packed index rows (`rows`, [capacity, columns]) and, with `ordinals`, each block's place in its tables."""

    def __init__(
        self,
        window_sizes: Sequence[int],
        max_row_blocks: int,
        capacity: int,
        ordinals: torch.Tensor | None = None,
    ) -> None:
        self.window_sizes = list(window_sizes)
        width = max_row_blocks
        self.num: dict[int | None, int] = {None: NUM_BLOCKS, **{w: HEAD + i for i, w in enumerate(self.window_sizes)}}
        """The column of each window's block count (None: every block of the row)."""
        first = HEAD + len(self.window_sizes)
        self.region: dict[str | int, int] = {
            "full": first,
            **{w: first + (1 + i) * width for i, w in enumerate(self.window_sizes)},
        }
        self.columns = self.columns_for(len(self.window_sizes), width)
        self.template = torch.zeros(self.columns, dtype=torch.int32)
        """A padding row: the scratch block's first slot."""
        self.template[FILL], self.template[NUM_BLOCKS], self.template[SELF] = 1, 1, PADDING_ROW
        for window in self.window_sizes:
            self.template[self.num[window]] = 1
        self.rows = self.template.repeat(max(1, capacity), 1)
        self._firsts: list[tuple[int, ...]] = []  # per row: the first block inside each window
        self._written = 0  # rows from the first that may differ from a padding row
        self.ordinals = ordinals
        self._dirty = (0, 0)  # the blocks whose ordinals changed since `take_dirty_ordinals`: [lo, hi)

    @staticmethod
    def columns_for(windows: int, max_row_blocks: int) -> int:
        """Entries of a packed row, with `windows` distinct sliding windows."""
        return HEAD + windows + (1 + windows) * max_row_blocks

    def columns_read(self, width: int) -> list[int]:
        """The columns a step whose rows hold at most `width` blocks reads: the counts, and each region's first
        `width` entries (a row's entries past its own blocks are never read)."""
        first = HEAD + len(self.window_sizes)
        starts = [self.region["full"], *(self.region[w] for w in self.window_sizes)]
        return [*range(first), *(c for s in starts for c in range(s, s + width))]

    def take_dirty_ordinals(self) -> tuple[int, int]:
        """The range [lo, hi) of blocks whose ordinals changed since the last call (empty: none)."""
        dirty, self._dirty = self._dirty, (0, 0)
        return dirty

    def reserve(self, rows: int) -> None:
        """Room for `rows` rows (padding included)."""
        if rows > self.rows.shape[0]:
            grown = self.template.repeat(max(rows, 2 * self.rows.shape[0]), 1)
            grown[: self.rows.shape[0]] = self.rows
            self.rows = grown

    def _firsts_of(self, length: int) -> tuple[int, ...]:
        return tuple(max(0, length - window) // BLOCK for window in self.window_sizes)

    def pack(self, row: int, table: Sequence[int], length: int) -> None:
        """Write row `row` whole from its block table and length (positions held, this step's included)."""
        self.reserve(row + 1)
        packed = self.rows[row]
        packed.copy_(self.template)
        self._written = max(self._written, row + 1)
        blocks = torch.tensor(table, dtype=torch.int32)
        full = self.region["full"]
        packed[full : full + len(table)] = blocks
        packed[LAST] = table[-1]
        packed[NUM_BLOCKS], packed[SELF] = len(table), row
        packed[POS], packed[FILL] = length - 1, (length - 1) % BLOCK + 1
        firsts = self._firsts_of(length)
        for window, first in zip(self.window_sizes, firsts):
            start = self.region[window]
            packed[self.num[window]] = len(table) - first
            packed[start : start + len(table) - first] = blocks[first:]
        while len(self._firsts) <= row:
            self._firsts.append(())
        self._firsts[row] = firsts
        self._place(blocks)

    def step(self, tables: Sequence[Sequence[int]], lengths: Sequence[int], grown: Sequence[int]) -> None:
        """A decode step: rows `grown` took a block, every row's length grew by one (`lengths`, this step's
        included)."""
        grew = {*grown, *range(len(self._firsts), len(lengths))}  # and rows never packed
        for row in sorted(grew):
            self.pack(row, tables[row], lengths[row])
        if self.window_sizes:
            for row, length in enumerate(lengths):
                if row not in grew and self._firsts_of(length) != self._firsts[row]:
                    self.pack(row, tables[row], length)
        count = len(lengths)
        if count:
            held = torch.tensor(lengths, dtype=torch.int32)
            self.rows[:count, POS] = held - 1
            self.rows[:count, FILL] = (held - 1) % BLOCK + 1

    def keep(
        self, order: Sequence[int], fresh: Sequence[int], tables: Sequence[Sequence[int]], lengths: Sequence[int]
    ) -> None:
        """Rows reordered: new row i is old row `order[i]`; rows `fresh` (new numbers) hold new blocks; the rows
        past the last become padding rows."""
        count = len(order)
        self.reserve(count)
        if count:
            self.rows[:count] = self.rows[torch.tensor(order, dtype=torch.long)]
            self.rows[:count, SELF] = torch.arange(count, dtype=torch.int32)
        known = len(self._firsts)
        self._firsts = [self._firsts[old] if old < known else () for old in order]
        if self._written > count:
            self.rows[count : self._written] = self.template
        self._written = count
        unpacked = [row for row, old in enumerate(order) if old >= known]  # rows never packed
        for row in sorted({*fresh, *unpacked}):
            self.pack(row, tables[row], lengths[row])
        if self.ordinals is not None:
            for table in tables:
                self._place(torch.tensor(table, dtype=torch.int32))

    def _place(self, blocks: torch.Tensor) -> None:
        """A table's `blocks` (int32, in table order) are at places 0, 1, ... in it."""
        if self.ordinals is not None and len(blocks):
            self.ordinals[blocks.long()] = torch.arange(len(blocks), dtype=torch.int32)
            lo, hi = int(blocks.min()), int(blocks.max()) + 1
            self._dirty = (min(lo, self._dirty[0]), max(hi, self._dirty[1])) if self._dirty[1] else (lo, hi)
