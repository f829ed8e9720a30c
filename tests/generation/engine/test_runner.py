"""The runner over a KV store: rows appended after the current ones (their positions, last states and captured layer
states concatenated, zeros where a forward captured no layer), a step padded to the store's bucket with its padding
rows dropped, rows kept or cleared as the layout compacts, and what the store holds read through the runner."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fides_rag.generation.engine.kv_cache import Prefilled
from fides_rag.generation.engine.runner import Runner

PAD = 7


class RecordingStore:
    """A KV store that records what the runner asks of it; its steps run at `bucket` rows."""

    pool = None
    captured = None
    shares_prompt_blocks = False
    extendable = False

    def __init__(self, bucket: int | None = None) -> None:
        self.step_bucket = bucket
        self.calls: list[tuple[Any, ...]] = []

    def bucket(self, rows: int, planned: int | None) -> int | None:
        return self.step_bucket

    def decode(self, ids, positions, layout, bucket, masker, timed=None) -> torch.Tensor:
        self.calls.append(("decode", ids[:, 0].tolist(), positions[:, 0].tolist(), list(layout.lengths), bucket))
        rows = ids.shape[0]
        return torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 1, 2)  # [Rb, 1, H=2]

    def append(self, state, lengths, prompts, pinned) -> None:
        self.calls.append(("append", list(lengths), prompts, pinned))

    def keep(self, rows, positions) -> torch.Tensor:
        self.calls.append(("keep", list(rows)))
        return positions[torch.tensor(rows, dtype=torch.long)]

    def clear(self) -> None:
        self.calls.append(("clear",))


def prefilled(positions: list[int], hidden: float) -> Prefilled:
    rows = len(positions)
    width = max(positions) + 1
    return Prefilled(
        torch.full((rows, 2), hidden),
        None,
        torch.ones((rows, width), dtype=torch.bool),
        torch.tensor([[p] for p in positions], dtype=torch.long),
    )


def runner_of(store: RecordingStore) -> Runner:
    return Runner(None, PAD, torch.device("cpu"), False, store=store)  # no anatomy: no model runs


def test_appended_rows_follow_the_current_ones_with_zeros_for_layers_not_captured():
    store = RecordingStore()
    runner = runner_of(store)
    assert runner.empty and runner.extendable  # an empty runner always takes rows
    runner.append(prefilled([2, 2], 1.0), {3: torch.full((2, 2), 5.0)}, [0, -1], [3, 3])
    runner.append(prefilled([3], 2.0), {4: torch.full((1, 2), 6.0)}, [-1], [4], prompts=["p"], pinned=[[1]])
    assert runner.positions is not None and runner.hidden is not None
    assert runner.positions[:, 0].tolist() == [2, 2, 3]
    assert runner.hidden[:, 0].tolist() == [1.0, 1.0, 2.0]
    assert runner.states[3].tolist() == [[5.0, 5.0], [5.0, 5.0], [0.0, 0.0]]
    assert runner.states[4].tolist() == [[0.0, 0.0], [0.0, 0.0], [6.0, 6.0]]
    assert runner.layout.lengths == [3, 3, 4] and runner.layout.row_head_sets == [0, -1, -1]
    assert store.calls == [("append", [3, 3], None, None), ("append", [4], ["p"], [[1]])]
    assert not runner.extendable  # with rows, the store decides


def test_a_step_runs_at_the_stores_bucket_and_drops_its_padding_rows():
    store = RecordingStore(bucket=4)
    runner = runner_of(store)
    runner.append(prefilled([2, 2], 1.0), {}, [-1, -1], [3, 3])
    capture = SimpleNamespace(states={3: torch.arange(8, dtype=torch.float32).reshape(4, 2)})
    runner.forward([11, 12], capture, None, bucket=4)
    assert store.calls[-1] == ("decode", [11, 12, PAD, PAD], [3, 3], [4, 4], 4)
    assert runner.positions is not None and runner.positions[:, 0].tolist() == [3, 3]
    assert runner.hidden is not None and runner.hidden.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert runner.states[3].tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_rows_are_kept_through_the_store_and_cleared_when_none_is_left():
    store = RecordingStore()
    runner = runner_of(store)
    runner.append(prefilled([2, 4], 1.0), {}, [-1, -1], [3, 5])
    runner.keep(None)  # nothing moved
    assert store.calls == [("append", [3, 5], None, None)]
    runner.keep([1, 1])
    assert store.calls[-1] == ("keep", [1, 1])
    assert runner.positions is not None and runner.positions[:, 0].tolist() == [4, 4]
    runner.keep([])
    assert store.calls[-1] == ("clear",)
    assert runner.positions is None and runner.hidden is None and runner.states == {}


def test_a_step_before_any_row_joined_is_refused():
    runner = runner_of(RecordingStore())
    with pytest.raises(RuntimeError, match="has no rows"):
        runner.forward([1], SimpleNamespace(states={}), None)


def test_the_pool_the_captured_step_and_prompt_sharing_are_the_stores():
    store = RecordingStore()
    store.pool, store.captured, store.shares_prompt_blocks = "pool", "captured", True
    runner = runner_of(store)
    assert runner.pool == "pool" and runner.captured == "captured" and runner.shares_prompt_blocks
