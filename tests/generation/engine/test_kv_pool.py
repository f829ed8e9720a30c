"""The fast mode's KV pool: attention over each row's own blocks (the gather path and flex's BlockMask) matches a
reference, the block lists flex receives are each row's blocks, and the pool's blocks are handed out and given back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicLayer

from fides_rag.generation.engine.attention.flex import FlexAttention, flex_unavailable, run_flex
from fides_rag.generation.engine.attention.gather import GatherAttention
from fides_rag.generation.engine.block_manager import BlockManager, PromptBlocks
from fides_rag.generation.engine.kv_cache import RaggedLayer
from fides_rag.generation.engine.kv_pool import BLOCK, KVPool

KV_HEADS, HEADS, DIM = 2, 4, 8


def pool_with_rows(
    attention: str,
    lengths: list[int],
    windows=(None,),
    blocks: int = 12,
    seed: int = 0,
    max_row_blocks: int = 6,
) -> KVPool:
    """A pool whose rows hold `lengths` positions of random keys and values, in scattered blocks."""
    torch.manual_seed(seed)
    like = torch.zeros(1, KV_HEADS, 1, DIM)
    backend = FlexAttention() if attention == "flex" else GatherAttention()
    pool = KVPool(
        list(windows), like, BlockManager(blocks), max_rows=8, max_row_blocks=max_row_blocks, attention=backend
    )
    pool.block_manager.free = pool.block_manager.free[::-1]  # hand out high blocks first: tables are not in slot order
    for layer in range(len(windows)):
        pool.keys[layer].normal_()
        pool.values[layer].normal_()
    for length in lengths:
        pool.tables.append(pool._take(-(-length // BLOCK)))
        pool.lengths.append(length)
    return pool


def reference(pool: KVPool, query: torch.Tensor, window: int | None) -> torch.Tensor:
    """Each row's attention over its own positions, one row at a time: [R, heads, 1, d]."""
    out = []
    for row, (table, length) in enumerate(zip(pool.tables, pool.lengths)):
        first = 0 if window is None else max(0, length - window)
        slots = torch.tensor(pool._slots(table, range(first, length)))
        keys, values = pool.keys[0][0][:, slots], pool.values[0][0][:, slots]  # [kv_heads, n, d]
        out.append(
            F.scaled_dot_product_attention(
                query[row], keys.repeat_interleave(HEADS // KV_HEADS, 0), values.repeat_interleave(HEADS // KV_HEADS, 0)
            )
        )
    return torch.stack(out)


def step(pool: KVPool, new_keys: torch.Tensor, new_values: torch.Tensor, padded: int | None = None):
    positions = torch.tensor([[length] for length in pool.lengths] + [[0]] * ((padded or 0) - pool.num_rows))
    pool.begin_step(positions, padded_rows=padded)
    return pool.write(0, new_keys, new_values), pool.masks[pool.windows[0]]


@pytest.mark.parametrize("window", [None, 20])
def test_gather_attention_sees_each_rows_own_positions_only(window):
    pool = pool_with_rows("gather", [5, 33, 16], windows=(window,))
    query = torch.randn(3, HEADS, 1, DIM)
    (keys, values), mask = step(pool, torch.randn(3, KV_HEADS, 1, DIM), torch.randn(3, KV_HEADS, 1, DIM))
    assert keys.shape == (3, KV_HEADS, 3 * BLOCK, DIM) and mask.shape == (
        3,
        1,
        1,
        3 * BLOCK,
    )  # the longest row's blocks
    got = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got, reference(pool, query, window))


def attend(pool: KVPool, attention: str, query: torch.Tensor) -> torch.Tensor:
    """Every row's attention at this step, through the pool's backend."""
    keys, values = pool.write(0, torch.randn(pool.rows, KV_HEADS, 1, DIM), torch.randn(pool.rows, KV_HEADS, 1, DIM))
    mask = pool.masks[pool.windows[0]]
    if attention == "flex":
        return run_flex(query, keys, values, mask, None, compiled=False)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("attention", ["gather", "flex"])
@pytest.mark.parametrize("window", [None, 20])
def test_a_steps_index_copy_follows_the_rows_blocks_not_the_context_window(attention, window):
    if attention == "flex" and flex_unavailable() is not None:
        pytest.skip(flex_unavailable())
    lengths, padded = [5, 33, 16], 4
    pools = {
        most: pool_with_rows(attention, lengths, windows=(window,), blocks=2000, max_row_blocks=most)
        for most in (8, 2000)
    }
    copied = {}
    for most, pool in pools.items():
        for number in range(20):  # rows grow past block boundaries; one leaves, the others swap places
            if number == 10:
                pool.keep([2, 0])
            rows = pool.num_rows
            pool.begin_step(torch.tensor([[n] for n in pool.lengths] + [[0]] * (padded - rows)), padded_rows=padded)
            query = torch.randn(padded, HEADS, 1, DIM)
            got = attend(pool, attention, query)[:rows]
            torch.testing.assert_close(got, reference(pool, query[:rows], window))
        copied[most] = pool.index_copy_bytes
    whole_rows = padded * pools[2000].columns * 4
    assert copied[2000] == copied[8] and copied[2000] * 50 < whole_rows  # the rows' blocks, not the window's


def test_gather_costs_the_rows_blocks_not_the_pool():
    small, large = pool_with_rows("gather", [40], blocks=8), pool_with_rows("gather", [40], blocks=400)
    (k_small, _), _ = step(small, torch.zeros(1, KV_HEADS, 1, DIM), torch.zeros(1, KV_HEADS, 1, DIM))
    (k_large, _), _ = step(large, torch.zeros(1, KV_HEADS, 1, DIM), torch.zeros(1, KV_HEADS, 1, DIM))
    assert k_small.shape == k_large.shape == (1, KV_HEADS, 3 * BLOCK, DIM)


def test_padding_rows_write_and_read_the_scratch_block_only():
    pool = pool_with_rows("gather", [5, 17])
    step(pool, torch.randn(4, KV_HEADS, 1, DIM), torch.randn(4, KV_HEADS, 1, DIM), padded=4)
    assert pool.write_slots[:4].tolist()[2:] == [0, 0]
    assert pool.masks[None][2:, 0, 0].sum(-1).tolist() == [1, 1]  # one position: the scratch slot


def test_flex_block_lists_name_each_rows_blocks_all_as_partial_blocks():
    pool = pool_with_rows("flex", [5, 33, 16], windows=(None, 16))
    step(pool, torch.zeros(3, KV_HEADS, 1, DIM), torch.zeros(3, KV_HEADS, 1, DIM))
    assert isinstance(pool.attention, FlexAttention)
    full = pool.attention.block_mask_tensors(pool.index[:3], None)
    tables = pool.tables  # lengths now 6, 34, 17: 1, 3 and 2 blocks
    assert full["kv_num_blocks"].flatten().tolist() == [1, 3, 2]
    assert [full["kv_indices"][r, 0, 0, : len(t)].tolist() for r, t in enumerate(tables)] == tables
    assert "full_kv_num_blocks" not in full  # no full blocks: flex-decoding's splits follow each row's blocks
    windowed = pool.attention.block_mask_tensors(
        pool.index[:3], 16
    )  # positions (length - 16, length]: blocks from (length-16)//16
    assert windowed["kv_num_blocks"].flatten().tolist() == [1, 2, 2]
    assert windowed["kv_indices"][1, 0, 0, :2].tolist() == tables[1][1:]
    assert "full_kv_num_blocks" not in windowed


@pytest.mark.skipif(flex_unavailable() is not None, reason="this torch has no flex attention")
@pytest.mark.parametrize("window", [None, 20])
def test_flex_attention_over_the_block_mask_matches_the_gather_path(window):
    query = torch.randn(3, HEADS, 1, DIM)
    new_keys, new_values = torch.randn(3, KV_HEADS, 1, DIM), torch.randn(3, KV_HEADS, 1, DIM)
    gathered = pool_with_rows("gather", [5, 33, 16], windows=(window,))
    (keys, values), mask = step(gathered, new_keys, new_values)
    expected = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True)
    flexed = pool_with_rows("flex", [5, 33, 16], windows=(window,))
    (keys, values), block_mask = step(flexed, new_keys, new_values)
    assert keys.shape[0] == 1  # the whole pool, shared by every query row
    torch.testing.assert_close(run_flex(query, keys, values, block_mask, None, compiled=False), expected)


def test_rows_that_leave_give_their_blocks_back_and_a_repeated_row_shares_them_until_it_writes():
    pool = pool_with_rows("gather", [20, 5])  # 2 + 1 blocks of 12
    assert pool.used_tokens == 3 * BLOCK and pool.capacity_tokens == 12 * BLOCK
    before = pool.keys[0].clone()
    pool.keep([0, 0])  # row 1 leaves, row 0 is repeated: by reference, nothing copied
    assert pool.tables[0] == pool.tables[1] and pool.used_tokens == 2 * BLOCK
    shared = pool.tables[0][-1]
    assert pool.block_manager.counts.shared == 2 and torch.equal(pool.keys[0], before)
    new_keys, new_values = torch.randn(2, KV_HEADS, 1, DIM), torch.randn(2, KV_HEADS, 1, DIM)
    (keys, _), mask = step(pool, new_keys, new_values)  # both rows write position 20, in their shared last block
    first, last = zip(*[(t[0], t[-1]) for t in pool.tables])
    assert first[0] == first[1] and last[0] != last[1]  # the full block stays shared, the written one is copied
    assert pool.block_manager.counts.copied_on_write == 1 and pool.used_tokens == 3 * BLOCK
    assert shared in last  # one row keeps the block, the other writes into its copy
    old = torch.tensor(pool._slots([shared], range(4)))
    copy = torch.tensor(pool._slots([b for b in last if b != shared], range(4)))
    torch.testing.assert_close(pool.keys[0][:, :, copy], before[:, :, old])  # the copy holds the shared states
    for row in range(2):  # each row sees its own new key at position 20
        torch.testing.assert_close(keys[row, :, 20], new_keys[row, :, 0])
    with pytest.raises(RuntimeError, match="free blocks"):
        pool._take(10)
    assert pool.used_tokens == 3 * BLOCK  # nothing taken


def ragged_rows(rows: list[torch.Tensor]) -> SimpleNamespace:
    """A one-layer prefill cache of rows [1, kv_heads, T, d] (keys and values alike)."""
    segments = []
    for keys in rows:
        layer = DynamicLayer()
        layer.update(keys, keys.clone())
        segments.append(layer)
    return SimpleNamespace(layers=[RaggedLayer(segments)])


def test_a_row_whose_prompt_blocks_are_kept_takes_them_by_reference_and_copies_only_the_rest():
    pool = KVPool([None], torch.zeros(1, KV_HEADS, 1, DIM), BlockManager(12), max_rows=8, max_row_blocks=6)
    first = torch.randn(1, KV_HEADS, 40, DIM)
    pool.add_rows(ragged_rows([first]), [40], [PromptBlocks([b"a", b"b"], [2])])
    assert pool.used_tokens == 3 * BLOCK and pool.block_manager.kept == 2  # its two full prompt blocks are kept
    second = torch.cat([first[:, :, :32], torch.randn(1, KV_HEADS, 5, DIM)], dim=2)
    pool.add_rows(ragged_rows([second]), [37], [PromptBlocks([b"a", b"b"], [2])])
    assert pool.tables[1][:2] == pool.tables[0][:2] and pool.tables[1][2] != pool.tables[0][2]
    assert pool.used_tokens == 4 * BLOCK and pool.block_manager.counts.shared == 2
    held = pool.keys[0][0][:, torch.tensor(pool._slots(pool.tables[1], range(37)))]
    torch.testing.assert_close(held, second[0])
    pool.add_rows(ragged_rows([torch.randn(1, KV_HEADS, 37, DIM)]), [37], [PromptBlocks([b"x", b"b"], [2])])
    assert pool.block_manager.counts.shared == 2  # another first block: nothing found, nothing shared


def test_only_the_leading_blocks_up_to_a_chunk_cut_are_taken_by_reference():
    pool = KVPool([None], torch.zeros(1, KV_HEADS, 1, DIM), BlockManager(12), max_rows=8, max_row_blocks=6)
    first = torch.randn(1, KV_HEADS, 50, DIM)
    pool.add_rows(ragged_rows([first]), [50], [PromptBlocks([b"a", b"b", b"c"], [1, 3])])
    pool.add_rows(ragged_rows([first[:, :, :49]]), [49], [PromptBlocks([b"a", b"b", b"c"], [1])])
    assert pool.tables[1][:1] == pool.tables[0][:1] and pool.tables[1][1] != pool.tables[0][1]


def test_kept_blocks_nothing_holds_are_given_back_to_make_room_but_not_those_a_joining_row_takes():
    pool = KVPool([None], torch.zeros(1, KV_HEADS, 1, DIM), BlockManager(5), max_rows=8, max_row_blocks=6)
    first = torch.randn(1, KV_HEADS, 33, DIM)
    pool.add_rows(ragged_rows([first]), [33], [PromptBlocks([b"a", b"b"], [2])])
    pool.keep([])  # the row leaves: its two prompt blocks stay kept, held by nothing else
    pool.add_rows(ragged_rows([torch.randn(1, KV_HEADS, 33, DIM)]), [33], [PromptBlocks([b"x", b"y"], [2])])
    pool.keep([])
    assert pool.block_manager.kept == 4 and len(pool.block_manager.free) == 1 and pool.used_tokens == 0
    second = torch.cat([first[:, :, :32], torch.randn(1, KV_HEADS, 48, DIM)], dim=2)
    pool.add_rows(ragged_rows([second]), [80], [PromptBlocks([b"a", b"b", b"c", b"d", b"e"], [2])])
    held = pool.keys[0][0][:, torch.tensor(pool._slots(pool.tables[0], range(80)))]
    torch.testing.assert_close(held, second[0])  # three own blocks: the free one and the other chain's two
    assert pool.block_manager.counts.kept_evicted == 2 and pool.block_manager.found([b"a", b"b"]) == pool.tables[0][:2]


@pytest.mark.parametrize(("attention", "keeps"), [("flex", True), ("gather", False)])
def test_the_pool_keeps_block_ordinals_only_for_a_backend_that_reads_them(attention, keeps):
    pool = pool_with_rows(attention, [5, 33])
    assert pool.attention.reads_block_ordinals is keeps
    assert (pool._host.ordinals is not None) is keeps
