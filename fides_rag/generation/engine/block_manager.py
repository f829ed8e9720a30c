"""The block manager of fast mode's KV pool, owned by the scheduler: which blocks are free, how many holders each has,
and the prompt blocks kept for reuse under their hashes. The pool (`kv_pool.py`) holds the tensors and the rows'
block tables, and takes and gives back blocks through it.

A block may be held by several rows at once (counted references): the rows of a request duplicated by `keep`, and
rows whose prompts start with the same blocks. A prompt block is found by the prefix cache's chained hash
(`PrefixCache.block_hashes`: parent, tokens, head set, chunk cuts), which fixes the forwards that computed its
states, so a row that takes a block by reference holds the states its own prefill computed. Rows never write a
shared block: prompt blocks are full, and a row about to write into a shared partial block copies it first
(`KVPool.begin_step`, copy on write).

Kept prompt blocks hold a reference of their own and outlive their rows; when the free blocks run short, those held
by nothing else are given back, least recently used first. The scheduler admits a request when its worst-case blocks
(every row its own) fit in what is `available` now less what the rows in flight may still take
(`InFlight.pool_growth`); the kept blocks a newcomer will take by reference are pinned for it at admission (`pin`)
and not counted against it, so a block several requests share is counted once, and the pool never runs out.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

from fides_rag.generation.engine.kv_pool_size import BLOCK


@dataclass(frozen=True)
class PromptBlocks:
    """A joining row's prompt blocks, for `KVPool.add_rows` to share and keep."""

    hashes: Sequence[bytes]
    """The chained hash of each full block of the prompt (`PrefixCache.block_hashes`)."""
    cut_blocks: Sequence[int]
    """Block counts at which one of the prompt's chunk cuts falls, before its end (the leading blocks a row may take
    by reference end at one of them)."""


@dataclass
class BlockCounts:
    shared: int = 0
    """Blocks rows took by reference instead of a copy (prompt blocks found kept, and duplicated rows' blocks)."""
    copied_on_write: int = 0
    """Shared blocks copied because a row was about to write into them."""
    kept_evicted: int = 0
    """Kept prompt blocks given back to make room."""


class BlockManager:
    """Free blocks 1..`blocks` (0 is scratch), each block's reference count, and the kept prompt blocks by hash."""

    def __init__(self, blocks: int) -> None:
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
            raise ValueError(f"a KV pool needs at least one block, got blocks={blocks!r}")
        self.blocks = blocks
        self.reset()

    def reset(self) -> None:
        """Every block free, none kept: the state of a new pool (whose tensors hold nothing yet)."""
        self.free = list(range(self.blocks, 0, -1))  # popped from the end: low blocks first
        self.refs = [0] * (self.blocks + 1)
        self.counts = BlockCounts()
        self._kept: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # hash -> block, LRU first
        self._hash_of: dict[int, bytes] = {}

    @property
    def kept(self) -> int:
        """Prompt blocks kept for reuse."""
        return len(self._kept)

    @property
    def kept_only(self) -> int:
        """Kept blocks no row holds (given back when the free ones run short)."""
        return sum(1 for block in self._kept.values() if self.refs[block] == 1)

    @property
    def available(self) -> int:
        """Blocks a take can hand out now: the free ones and the kept ones no row holds."""
        return len(self.free) + self.kept_only

    @property
    def held(self) -> int:
        """Blocks some row holds."""
        return self.blocks - len(self.free) - self.kept_only

    def take(self, count: int) -> list[int]:
        """`count` blocks, each with one reference; kept blocks no row holds are given back first if need be."""
        if count > len(self.free):
            self._evict(count - len(self.free))
        if count > len(self.free):
            raise RuntimeError(
                f"the KV pool has {len(self.free)} free blocks of {self.blocks}, {count} asked: the scheduler "
                "admits a request only when its blocks fit, so this is a bug"
            )
        taken = self.free[len(self.free) - count :][::-1]
        del self.free[len(self.free) - count :]
        for block in taken:
            self.refs[block] = 1
        return taken

    def share(self, blocks: Sequence[int]) -> None:
        """One more holder of each of `blocks`, a row taking them by reference."""
        self.hold(blocks)
        self.counts.shared += len(blocks)

    def hold(self, blocks: Sequence[int]) -> None:
        """One more holder of each of `blocks` (not yet a row: a request admitted, still prefilling)."""
        for block in blocks:
            self.refs[block] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """One holder fewer of each of `blocks`; a block nothing holds is free again."""
        for block in reversed(blocks):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)

    def is_shared(self, block: int) -> bool:
        return self.refs[block] > 1

    def found(self, hashes: Sequence[bytes]) -> list[int]:
        """The kept blocks of the leading `hashes` found (a run from the first), marked recently used."""
        blocks = []
        for key in hashes:
            block = self._kept.get(key)
            if block is None:
                break
            blocks.append(block)
        for key in reversed(hashes[: len(blocks)]):
            self._kept.move_to_end(key)
        return blocks

    def keep(self, hashes: Sequence[bytes], blocks: Sequence[int]) -> None:
        """Keep prompt blocks `blocks` (one reference each) under their `hashes`, those not kept already."""
        for key, block in zip(hashes, blocks):
            if key in self._kept or block in self._hash_of:
                continue
            self._kept[key] = block
            self._hash_of[block] = key
            self.refs[block] += 1
        for key in reversed(hashes):  # a chain's first block the most recent: eviction takes chains from their ends
            if key in self._kept:
                self._kept.move_to_end(key)

    def shared_prefix(self, prompt: PromptBlocks) -> list[int]:
        """The kept blocks a joining row takes by reference: its leading blocks found kept, up to the last that ends at
        one of its chunk cuts (whose states its own forwards would compute alike), never its last position's block."""
        found = self.found(prompt.hashes)
        usable = max((n for n in prompt.cut_blocks if n <= len(found)), default=0)
        return found[:usable]

    def pin(self, prompts: Sequence[PromptBlocks]) -> tuple[list[list[int]], int]:
        """Hold, for rows that will join later, the kept blocks each would take by reference now: per row the blocks
        held, and how many of them no row held before (they were given back on demand until now)."""
        pinned = [self.shared_prefix(p) for p in prompts]
        unheld = sum(1 for blocks in pinned for b in blocks if self.refs[b] == 1)
        for blocks in pinned:
            self.hold(blocks)
        return pinned, unheld

    def unpin(self, pinned: Sequence[Sequence[int]]) -> None:
        """Give back blocks held by `pin` (a request that left before it joined, or one whose rows joined)."""
        for blocks in pinned:
            self.release(blocks)

    def keep_prompt(self, prompt: PromptBlocks, table: Sequence[int], written: int, length: int) -> None:
        """Keep a joined row's full prompt blocks (`table`'s) that every layer wrote from position `written` on (a
        sliding-window layer holds only its window) and that no later write touches (the block of its last position,
        `length - 1`, is left out)."""
        first = -(-written // BLOCK)
        last = (length - 1) // BLOCK
        end = min(last, len(prompt.hashes))
        if first < end:
            self.keep(prompt.hashes[first:end], table[first:end])

    def _evict(self, needed: int) -> None:
        """Give back up to `needed` kept blocks that no row holds, least recently used first."""
        for key, block in list(self._kept.items()):
            if needed <= 0:
                return
            if self.refs[block] == 1:
                del self._kept[key], self._hash_of[block]
                self.release([block])
                self.counts.kept_evicted += 1
                needed -= 1
