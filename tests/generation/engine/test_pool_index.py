"""The packed index kept on the host from step to step equals the index rebuilt whole from the block tables, through
rows joining, decoding past block and window boundaries, and leaving or being copied."""

from __future__ import annotations

import random

import pytest
import torch

from fides_rag.generation.engine.kv_pool_size import BLOCK
from fides_rag.generation.engine.pool_index import (
    FILL,
    LAST,
    NUM_BLOCKS,
    POS,
    SELF,
    HostIndex,
)


def rebuilt(index: HostIndex, tables: list[list[int]], lengths: list[int], padded: int) -> torch.Tensor:
    """The packed rows built from nothing (every row, every step)."""
    host = index.template.repeat(padded, 1)
    full = index.region["full"]
    for r, (table, length) in enumerate(zip(tables, lengths)):
        row = host[r]
        row[FILL], row[LAST], row[POS] = (length - 1) % BLOCK + 1, table[-1], length - 1
        row[NUM_BLOCKS], row[SELF] = len(table), r
        row[full : full + len(table)] = torch.tensor(table, dtype=torch.int32)
        for window in index.window_sizes:
            first = max(0, length - window) // BLOCK
            start = index.region[window]
            row[index.num[window]] = len(table) - first
            row[start : start + len(table) - first] = torch.tensor(table[first:], dtype=torch.int32)
    return host


def places(tables: list[list[int]], blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each held block's place in its table, and which blocks are held."""
    ordinal = torch.zeros(blocks, dtype=torch.int32)
    held = torch.zeros(blocks, dtype=torch.bool)
    for table in tables:
        for i, b in enumerate(table):
            ordinal[b], held[b] = i, True
    return ordinal, held


@pytest.mark.parametrize("windows", [(), (24,), (24, 40)])
def test_the_index_kept_step_by_step_equals_the_index_rebuilt_from_the_tables(windows):
    rng = random.Random(0)
    blocks = 400
    ordinal = torch.zeros(blocks, dtype=torch.int32)
    index = HostIndex(windows, max_row_blocks=40, capacity=2, ordinals=ordinal)
    free = list(range(blocks - 1, 0, -1))
    tables: list[list[int]] = []
    lengths: list[int] = []
    for _ in range(120):
        action = rng.random()
        if action < 0.15 or not tables:  # rows join
            for _ in range(rng.randint(1, 3)):
                length = rng.randint(1, 90)
                tables.append([free.pop() for _ in range(-(-length // BLOCK))])
                lengths.append(length)
                index.pack(len(tables) - 1, tables[-1], lengths[-1])
        elif action < 0.25:  # rows leave, one is copied into new blocks
            order = sorted(rng.sample(range(len(tables)), rng.randint(1, len(tables))))
            rng.shuffle(order)
            fresh = []
            if rng.random() < 0.5:
                order.append(order[0])
                fresh.append(len(order) - 1)
            kept = {*order}
            for r in range(len(tables)):
                if r not in kept:
                    free += tables[r]
            new_tables = []
            for i, old in enumerate(order):
                new_tables.append([free.pop() for _ in tables[old]] if i in fresh else tables[old])
            tables, lengths = new_tables, [lengths[old] for old in order]
            index.keep(order, fresh, tables, lengths)
        else:  # a decode step
            grown = []
            for r, length in enumerate(lengths):
                if length % BLOCK == 0:
                    tables[r].append(free.pop())
                    grown.append(r)
                lengths[r] = length + 1
            index.step(tables, lengths, grown)
        padded = len(tables) + rng.randint(0, 3)
        index.reserve(padded)
        assert torch.equal(index.rows[:padded], rebuilt(index, tables, lengths, padded))
        expected_ordinal, held = places(tables, blocks)
        assert torch.equal(ordinal[held], expected_ordinal[held])
