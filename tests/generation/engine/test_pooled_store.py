"""Fast mode's KV store before any row joins: the bucket a step runs at (the plan's, unless rows changed since; a
bucket where the step is captured, none past the largest; none for an eager backend without a static batch), and a
backend that does not attend over the pool refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fides_rag.generation.engine.block_manager import BlockManager
from fides_rag.generation.engine.captured_step import bucket_for, fits_buckets
from fides_rag.generation.engine.pooled_store import PooledStore, PoolSettings

BUCKETS = (1, 2, 4, 8)


def settings(**changes) -> PoolSettings:
    return PoolSettings(**{"max_rows": 8, "max_row_blocks": 4, "attention": "gather", "buckets": BUCKETS, **changes})


def test_an_eager_step_over_gather_attention_is_never_padded():
    store = PooledStore(None, settings(), BlockManager(4))  # no anatomy: no model runs
    assert store.bucket(3, 4) is None and store.bucket(3, None) is None
    assert store.pool is None and store.captured is None
    assert store.shares_prompt_blocks and store.extendable


def test_a_captured_step_runs_at_the_plans_bucket_unless_its_rows_outgrew_it():
    captured = SimpleNamespace(bucket=lambda rows: bucket_for(rows, BUCKETS) if fits_buckets(rows, BUCKETS) else None)
    store = PooledStore(None, settings(captured=captured), BlockManager(4))
    assert store.captured is captured
    assert store.bucket(3, 4) == 4 and store.bucket(3, 8) == 8  # the plan's
    assert store.bucket(5, 4) == 8 and store.bucket(3, None) == 4 and store.bucket(3, 3) == 4  # rows changed since
    assert store.bucket(9, None) is None  # past the largest: eager, unpadded


def test_a_backend_that_does_not_attend_over_the_pool_is_refused():
    with pytest.raises(ValueError, match="does not attend over fast mode's pool"):
        PooledStore(None, settings(attention="ragged"), BlockManager(4))
