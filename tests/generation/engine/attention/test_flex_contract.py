"""The CUDA path's assumptions, checked on the CPU: flex attention over the pool equals the gather on every row
count (eager and compiled, sliding windows and shared blocks), every flex call the engine makes has kernel options
that divide the pool's block, a static batch and no full blocks, and flex-decoding's KV splits follow each row's
blocks rather than the pool's length."""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as torch_flex
import torch.nn.functional as F

from fides_rag import FidesDecoder, PromptTemplate
from fides_rag.generation.engine.attention.flex import (
    KERNEL_OPTIONS,
    FlexAttention,
    decode_split_shares,
    flex_unavailable,
    run_flex,
)
from fides_rag.generation.engine.attention.gather import GatherAttention
from fides_rag.generation.engine.block_manager import BlockManager
from fides_rag.generation.engine.captured_step import DEFAULT_BUCKETS
from fides_rag.generation.engine.kv_pool import BLOCK, KVPool

pytestmark = pytest.mark.skipif(flex_unavailable() is not None, reason="this torch has no flex attention")

KV_HEADS, HEADS, DIM = 2, 4, 16
ROW_COUNTS = [1, 2, 3, 5, 9, 17, 33]
WINDOWS = (None, 24)
"""A sliding-window family: one full-attention layer, one of a 24-position window."""


def pool_with_rows(backend, lengths: list[int], padded: int, max_row_blocks: int = 16, seed: int = 0) -> KVPool:
    """A pool whose rows hold `lengths` positions of random states; every third row shares its first blocks with the
    row before it (as rows of one prompt do), and a step begins at `padded` rows."""
    torch.manual_seed(seed)
    blocks = sum(-(-n // BLOCK) + 1 for n in lengths) + 4
    pool = KVPool(
        list(WINDOWS),
        torch.zeros(1, KV_HEADS, 1, DIM),
        BlockManager(blocks),
        max_rows=64,
        max_row_blocks=max_row_blocks,
        attention=backend,
    )
    pool.block_manager.free = pool.block_manager.free[::-1]  # tables out of slot order
    for layer in range(len(WINDOWS)):
        pool.keys[layer].normal_()
        pool.values[layer].normal_()
    for row, length in enumerate(lengths):
        before = pool.tables[row - 1] if row % 3 == 2 else []
        shared = before[: max(0, min(len(before) - 1, (length - 1) // BLOCK))]  # never its last block
        pool.block_manager.share(shared)
        own = pool.block_manager.take(-(-length // BLOCK) - len(shared))
        pool.tables.append(shared + own)
        pool.lengths.append(length)
    positions = torch.tensor([[n] for n in lengths] + [[0]] * (padded - len(lengths)))
    pool.begin_step(positions, padded_rows=padded)
    return pool


def attend(pool: KVPool, layer: int, query: torch.Tensor, compiled: bool = False) -> torch.Tensor:
    new = torch.zeros(query.shape[0], KV_HEADS, 1, DIM)
    keys, values = pool.write(layer, new, new)
    mask = pool.masks[pool.windows[layer]]
    if isinstance(pool.attention, FlexAttention):
        return run_flex(query, keys, values, mask, None, compiled=compiled)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)


def lengths_of(rows: int) -> list[int]:
    return [5 + (37 * i) % 90 + (40 if i % 3 == 2 else 0) for i in range(rows)]


@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("layer", [0, 1], ids=["full", "window"])
def test_eager_flex_equals_the_gather_on_every_row_count(rows, layer):
    padded = next(b for b in DEFAULT_BUCKETS if b >= rows)
    query = torch.randn(padded, HEADS, 1, DIM)
    gathered = attend(pool_with_rows(GatherAttention(), lengths_of(rows), padded), layer, query)
    flexed = attend(pool_with_rows(FlexAttention(), lengths_of(rows), padded), layer, query)
    torch.testing.assert_close(flexed[:rows], gathered[:rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 5, 33])
def test_compiled_flex_equals_the_gather(rows):
    """Inductor's CPU flex template needs block lists that could cover the whole pool (its CUDA templates do not):
    rows here may hold every block."""
    padded = next(b for b in DEFAULT_BUCKETS if b >= rows)
    query = torch.randn(padded, HEADS, 1, DIM)
    for layer in (0, 1):
        gathered = attend(pool_with_rows(GatherAttention(), lengths_of(rows), padded), layer, query)
        pool = pool_with_rows(FlexAttention(), lengths_of(rows), padded, max_row_blocks=10**6)
        flexed = attend(pool, layer, query, compiled=True)
        torch.testing.assert_close(flexed[:rows], gathered[:rows], atol=1e-4, rtol=1e-4)


def test_shared_blocks_are_listed_in_every_row_that_holds_them():
    pool = pool_with_rows(FlexAttention(), lengths_of(9), 9)
    assert any(pool.block_manager.is_shared(b) for t in pool.tables for b in t), "the fixture shares blocks"
    lists = pool.attention.block_mask_tensors(pool.index[:9], None)
    for row, table in enumerate(pool.tables):
        assert lists["kv_indices"][row, 0, 0, : len(table)].tolist() == table


def test_every_flex_call_of_the_engine_has_dividing_tiles_a_static_batch_and_no_full_blocks(
    tiny_llama, tokenizer, monkeypatch
):
    calls: list[tuple[int, dict, object]] = []
    original = torch_flex.flex_attention

    def recording(query, key, value, *args, block_mask=None, kernel_options=None, **kwargs):
        calls.append((query.shape[0], dict(kernel_options or {}), block_mask))
        return original(query, key, value, *args, block_mask=block_mask, kernel_options=kernel_options, **kwargs)

    monkeypatch.setattr(torch_flex, "flex_attention", recording)
    template = PromptTemplate(stop=())
    flex = FidesDecoder(
        tiny_llama, tokenizer, prompt_template=template, mode="fast", attention="flex", kv_pool_tokens=2048
    )
    gather = FidesDecoder(tiny_llama, tokenizer, prompt_template=template, mode="fast", kv_pool_tokens=2048)
    assert flex.limits.attention == "flex" and gather.limits.attention == "gather"
    questions = [f"Question {i}: where is the river?" for i in range(5)]
    handles = [
        flex.submit(q, [f"The river {i} flows north."], method=m, max_new_tokens=4 + i)
        for i, (q, m) in enumerate(zip(questions, ["fides", "standard", "cad", "fides", "standard"]))
    ]
    results = [h.result() for h in handles]
    assert calls, "the engine ran flex attention"
    for batch, options, mask in calls:
        assert batch in DEFAULT_BUCKETS  # every step padded to a bucket: the batch is static
        assert BLOCK % options["BLOCK_M"] == 0 and BLOCK % options["BLOCK_N"] == 0
        assert mask.full_kv_num_blocks is None  # every block partial
    assert {batch for batch, _, _ in calls} > {1}  # several row counts ran
    for i, (q, m) in enumerate(zip(questions, ["fides", "standard", "cad", "fides", "standard"])):
        alone = gather.generate(q, [f"The river {i} flows north."], method=m, max_new_tokens=4 + i)
        assert results[i].token_ids == alone.token_ids
    assert flex.stats.failed == 0


def test_kernel_options_divide_the_pool_block():
    assert BLOCK % KERNEL_OPTIONS["BLOCK_M"] == 0 and BLOCK % KERNEL_OPTIONS["BLOCK_N"] == 0


def test_flex_decoding_splits_follow_a_short_rows_blocks_in_a_large_pool():
    """One 2k-token row in a 262k-position pool, Llama-3.1-8B's 8 KV heads, an H200's 132 SMs."""
    partial = decode_split_shares(2048 // BLOCK, 262_144, num_sms=132, batch=1, kv_heads=8, full_blocks=False)
    mean = 2048 / len(partial)
    assert sum(partial) == 2048 and max(partial) <= 2 * mean
    with_full = decode_split_shares(2048 // BLOCK, 262_144, num_sms=132, batch=1, kv_heads=8, full_blocks=True)
    assert max(with_full) == 2048  # the layout this replaces: the whole row in one split
