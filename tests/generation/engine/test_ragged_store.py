"""Exact mode's KV store: a step attends with the left-padded mask grown by one column, and with no mask at all when
every row has the same length (the cache is then marked unpadded); rows that join are padded to the wider mask, and
kept rows lose the columns only rows that left had."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fides_rag.generation.engine.kv_cache import Prefilled
from fides_rag.generation.engine.layout import RowLayout
from fides_rag.generation.engine.ragged_store import RaggedStore


class FakeAnatomy:
    """Records the mask of every backbone forward; the cache goes back as it came."""

    def __init__(self) -> None:
        self.masks: list[torch.Tensor | None] = []

    def run_backbone(self, ids, mask, positions, cache):
        self.masks.append(None if mask is None else mask.clone())
        return torch.zeros((ids.shape[0], 1, 2)), cache


def step(store: RaggedStore, lengths: list[int]) -> None:
    """One decode step of rows of `lengths` cached positions (before the step)."""
    layout = RowLayout()
    layout.append([-1] * len(lengths), lengths)
    layout.grow()
    rows = len(lengths)
    store.decode(torch.zeros((rows, 1), dtype=torch.long), torch.tensor([[n] for n in lengths]), layout, None, None)


def test_rows_of_unequal_lengths_attend_with_the_grown_mask_and_equal_ones_with_none():
    anatomy = FakeAnatomy()
    store = RaggedStore(anatomy)
    assert store.pool is None and store.captured is None and not store.shares_prompt_blocks
    assert store.bucket(3, 4) is None  # never padded
    cache = SimpleNamespace(padded=True)
    mask = torch.tensor([[False, True, True], [True, True, True]])
    store.append(Prefilled(torch.zeros((2, 2)), cache, mask, torch.tensor([[1], [2]])), [2, 3], None, None)
    step(store, [2, 3])
    assert anatomy.masks[-1] is not None
    assert anatomy.masks[-1].tolist() == [[False, True, True, True], [True, True, True, True]]
    assert cache.padded

    store.clear()
    equal = SimpleNamespace(padded=True)
    full = torch.ones((2, 3), dtype=torch.bool)
    store.append(Prefilled(torch.zeros((2, 2)), equal, full, torch.tensor([[2], [2]])), [3, 3], None, None)
    step(store, [3, 3])
    assert anatomy.masks[-1] is None and not equal.padded


def test_joining_rows_are_padded_to_the_wider_mask_and_kept_rows_drop_the_columns_only_leavers_had():
    selected: list[list[int]] = []
    longest = [4]  # the kept rows' longest cached length, as the cache reports it
    layer = SimpleNamespace(get_seq_length=lambda: longest[0])
    cache = SimpleNamespace(padded=True, layers=[layer], batch_select_indices=selected.append)
    store = RaggedStore(FakeAnatomy())
    short = torch.ones((1, 2), dtype=torch.bool)
    store.append(Prefilled(torch.zeros((1, 2)), cache, short, torch.tensor([[1]])), [2], None, None)
    joining = SimpleNamespace(layers=[])  # no layer segments to merge
    wide = torch.ones((1, 4), dtype=torch.long)  # a prefill's mask: joined as bool
    store.append(Prefilled(torch.zeros((1, 2)), joining, wide, torch.tensor([[3]])), [4], None, None)
    assert store.mask is not None
    assert store.mask.tolist() == [[False, False, True, True], [True, True, True, True]]
    longest[0] = 2
    positions = store.keep([0], torch.tensor([[1], [3]]))
    assert selected == [[0]] and positions.tolist() == [[1]]
    assert store.mask is not None and store.mask.tolist() == [[True, True]]
