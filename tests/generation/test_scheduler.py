"""The scheduler's step budget: decodes first, then prefill chunks within max_num_batched_tokens, the first chunk
of a step always (so prefill progresses and a running decode waits at most one chunk)."""

from __future__ import annotations

import pytest

from fides_rag.generation.prefilling import chunk_cuts
from fides_rag.generation.scheduler import Scheduler


def test_decodes_take_their_tokens_first_and_chunks_fill_the_rest():
    budget = Scheduler(max_num_batched_tokens=64).step_budget(decode_rows=24)
    assert budget.take(32) and not budget.take(16) and budget.take(8)


def test_the_first_chunk_of_a_step_runs_even_past_the_budget():
    budget = Scheduler(max_num_batched_tokens=64).step_budget(decode_rows=100)
    assert budget.take(64) and not budget.take(1)


def test_chunks_are_cut_at_anchors_and_multiples_of_the_chunk_size():
    assert chunk_cuts(100, 32, anchors=[10, 0, 100, 40]) == [10, 32, 40, 64, 96, 100]
    assert chunk_cuts(20, 32, anchors=[]) == [20]


@pytest.mark.parametrize("setting", [{"max_requests": 0}, {"window_s": -1}, {"admission": "eager"}, {"max_num_batched_tokens": 8}])
def test_bad_settings_are_refused(setting):
    with pytest.raises(ValueError):
        Scheduler(**{"max_num_batched_tokens": 64, **setting})
