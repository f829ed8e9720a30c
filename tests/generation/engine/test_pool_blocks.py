"""The KV pool's block accounting: references counted, blocks freed when nothing holds them, prompt blocks kept by
hash and found as a leading run, and kept blocks nothing else holds given back, least recently used first."""

from __future__ import annotations

import pytest

from fides_rag.generation.engine.pool_blocks import PoolBlocks


def test_a_block_is_free_again_only_when_its_last_holder_lets_go():
    blocks = PoolBlocks(4)
    taken = blocks.take(2)
    assert taken == [1, 2] and blocks.held == 2
    blocks.share(taken)
    blocks.release(taken)
    assert blocks.held == 2 and all(blocks.is_shared(b) is False for b in taken)
    blocks.release(taken)
    assert blocks.held == 0 and sorted(blocks.free) == [1, 2, 3, 4]


def test_kept_prompt_blocks_are_found_as_a_leading_run_of_their_hashes():
    blocks = PoolBlocks(6)
    row = blocks.take(3)
    blocks.keep([b"a", b"b", b"c"], row)
    assert blocks.kept == 3 and all(blocks.is_shared(b) for b in row)
    assert blocks.found([b"a", b"b", b"x", b"c"]) == row[:2]
    assert blocks.found([b"x", b"a"]) == []
    blocks.keep([b"a"], [5])  # a hash kept already keeps its block
    assert blocks.found([b"a"]) == [row[0]]


def test_kept_blocks_outlive_their_row_and_are_given_back_when_blocks_run_short():
    blocks = PoolBlocks(4)
    row = blocks.take(3)
    blocks.keep([b"a", b"b", b"c"], row)
    blocks.release(row)  # the row leaves; its blocks stay kept
    assert blocks.held == 0 and blocks.kept_only == 3 and len(blocks.free) == 1
    blocks.found([b"a"])  # the chain's first block is the most recently used
    taken = blocks.take(2)  # one free, one given back: the chain's end first
    assert blocks.counts.kept_evicted == 1 and blocks.found([b"a", b"b", b"c"]) == row[:2]
    assert row[2] in taken


def test_a_kept_block_a_row_holds_is_never_given_back():
    blocks = PoolBlocks(2)
    row = blocks.take(2)
    blocks.keep([b"a", b"b"], row)
    with pytest.raises(RuntimeError, match="the KV pool has 0 free blocks of 2, 1 asked"):
        blocks.take(1)
    assert blocks.found([b"a", b"b"]) == row
