"""The scheduler's block manager of the KV pool: references counted, blocks freed when nothing holds them, prompt
blocks kept by hash and found as a leading run, pinned for a request until it joins, and kept blocks nothing else holds
given back, least recently used first."""

from __future__ import annotations

import pytest

from fides_rag.generation.engine.block_manager import BlockManager, PromptBlocks
from fides_rag.generation.engine.kv_pool_size import BLOCK


def test_a_block_is_free_again_only_when_its_last_holder_lets_go():
    blocks = BlockManager(4)
    taken = blocks.take(2)
    assert taken == [1, 2] and blocks.held == 2
    blocks.share(taken)
    blocks.release(taken)
    assert blocks.held == 2 and all(blocks.is_shared(b) is False for b in taken)
    blocks.release(taken)
    assert blocks.held == 0 and sorted(blocks.free) == [1, 2, 3, 4]


def test_kept_prompt_blocks_are_found_as_a_leading_run_of_their_hashes():
    blocks = BlockManager(6)
    row = blocks.take(3)
    blocks.keep([b"a", b"b", b"c"], row)
    assert blocks.kept == 3 and all(blocks.is_shared(b) for b in row)
    assert blocks.found([b"a", b"b", b"x", b"c"]) == row[:2]
    assert blocks.found([b"x", b"a"]) == []
    blocks.keep([b"a"], [5])  # a hash kept already keeps its block
    assert blocks.found([b"a"]) == [row[0]]


def test_kept_blocks_outlive_their_row_and_are_given_back_when_blocks_run_short():
    blocks = BlockManager(4)
    row = blocks.take(3)
    blocks.keep([b"a", b"b", b"c"], row)
    blocks.release(row)  # the row leaves; its blocks stay kept
    assert blocks.held == 0 and blocks.kept_only == 3 and len(blocks.free) == 1
    blocks.found([b"a"])  # the chain's first block is the most recently used
    taken = blocks.take(2)  # one free, one given back: the chain's end first
    assert blocks.counts.kept_evicted == 1 and blocks.found([b"a", b"b", b"c"]) == row[:2]
    assert row[2] in taken


def test_a_kept_block_a_row_holds_is_never_given_back():
    blocks = BlockManager(2)
    row = blocks.take(2)
    blocks.keep([b"a", b"b"], row)
    with pytest.raises(RuntimeError, match="the KV pool has 0 free blocks of 2, 1 asked"):
        blocks.take(1)
    assert blocks.found([b"a", b"b"]) == row


def prompt(hashes: list[bytes], cuts: list[int]) -> PromptBlocks:
    return PromptBlocks(hashes=hashes, cut_blocks=cuts)


def test_a_joining_row_takes_kept_blocks_by_reference_only_up_to_a_chunk_cut():
    manager = BlockManager(8)
    row = manager.take(4)
    manager.keep([b"a", b"b", b"c"], row[:3])
    assert manager.shared_prefix(prompt([b"a", b"b", b"c", b"d"], [2, 4])) == row[:2]  # the cut at 2 blocks
    assert manager.shared_prefix(prompt([b"a", b"b", b"c"], [3])) == row[:3]
    assert manager.shared_prefix(prompt([b"x", b"b"], [1, 2])) == []


def test_pinned_blocks_survive_eviction_until_unpinned_and_count_those_no_row_held():
    manager = BlockManager(4)
    row = manager.take(2)
    manager.keep([b"a", b"b"], row)
    manager.release(row)  # the row left: its prompt blocks are kept only
    assert manager.available == 4 and manager.kept_only == 2
    pinned, unheld = manager.pin([prompt([b"a", b"b"], [2])])
    assert pinned == [row] and unheld == 2 and manager.available == 2
    with pytest.raises(RuntimeError, match="this is a bug"):
        manager.take(3)  # pinned blocks are not given back
    manager.unpin(pinned)
    assert manager.available == 4 and len(manager.take(4)) == 4  # and now they are


def test_a_joined_rows_prompt_blocks_are_kept_except_its_last_positions_block_and_unwritten_ones():
    manager = BlockManager(8)
    table = manager.take(4)
    manager.keep_prompt(prompt([b"a", b"b", b"c", b"d"], [4]), table, written=0, length=3 * BLOCK + 1)
    assert manager.kept == 3 and manager.found([b"a", b"b", b"c", b"d"]) == table[:3]
    other = BlockManager(8)
    table = other.take(4)
    other.keep_prompt(prompt([b"a", b"b", b"c"], [3]), table, written=BLOCK + 1, length=3 * BLOCK + 1)
    assert other.kept == 1 and other.found([b"c"]) == [table[2]]  # a window's layer wrote from block 2 on


def test_reset_gives_a_new_pools_state_and_bad_sizes_are_refused():
    manager = BlockManager(3)
    manager.keep([b"a"], manager.take(1))
    manager.reset()
    assert manager.available == 3 and manager.kept == 0 and manager.held == 0
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="at least one block"):
            BlockManager(bad)
