"""What `InFlight` holds for a request admitted and not yet joined: its prompt blocks are hashed once (at admission,
reused when it joins), and the blocks pinned for it are counted as pins are taken and given back, so the count always
equals a recount of the jobs' pins and the pins the pool holds, whatever order requests are reserved, given back,
begun, cancelled, joined or failed in."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fides_rag.generation.engine.block_manager import PromptBlocks
from fides_rag.generation.engine.in_flight import InFlight
from fides_rag.generation.engine.kv_pool_size import BLOCK
from fides_rag.generation.engine.prefilling import RowPrefill, TicketPrefill, chunk_cuts
from fides_rag.generation.engine.prefix_cache import PrefixCache

CHUNK = 32


class FakeBlockManager:
    """Pins blocks as `BlockManager.pin` does (a random leading run of each prompt's blocks), counting them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.pins = 0

    def pin(self, prompts: list[PromptBlocks]) -> tuple[list[list[int]], int]:
        pinned = [list(range(1, 1 + self.rng.randint(0, len(p.hashes)))) for p in prompts]
        self.pins += sum(len(b) for b in pinned)
        return pinned, 0

    def unpin(self, pinned: list[list[int]]) -> None:
        self.pins -= sum(len(b) for b in pinned)
        assert self.pins >= 0


class FakeRunner:
    """A fast-mode `Runner`'s seam as `InFlight` uses it: rows join by `append`, which takes over the pins (the pool's
    `add_rows`, which gives them back to the block manager). A new runner, as a new pooled store, starts from an empty
    pool."""

    shares_prompt_blocks = True
    pool = None

    def __init__(self, blocks: FakeBlockManager) -> None:
        self.blocks = blocks
        blocks.pins = 0
        self.layout = SimpleNamespace(num_rows=0, compact=lambda active: [])
        self.appended: list[Any] = []

    def append(self, prefilled, states, head_sets, lengths, prompts=None, pinned=None) -> None:
        self.appended.append(prompts)
        if pinned is not None:
            self.blocks.unpin(pinned)

    def keep(self, rows) -> None:
        pass


class FakeHandle:
    def __init__(self) -> None:
        self.cancelled = False

    def done(self) -> bool:
        return self.cancelled


def ticket() -> SimpleNamespace:
    return SimpleNamespace(units=[], handle=FakeHandle(), close_cancelled=lambda: None, fail=lambda error: None)


def flight_of(seed: int) -> tuple[InFlight, PrefixCache, list[int]]:
    """An `InFlight` over fake runners whose jobs are rows of random prompts; and the count of prompt hashings."""
    rng = random.Random(seed)
    prefixes = PrefixCache(block_size=BLOCK)
    hashed = [0]
    block_hashes = prefixes.block_hashes

    def counting(tokens, cuts, head_key):
        hashed[0] += 1
        return block_hashes(tokens, cuts, head_key)

    prefixes.block_hashes = counting
    stats = SimpleNamespace(prompt_tokens=0, cancelled=0, failed=0, admissions=0)
    anatomy = SimpleNamespace(num_layers=2, config=None)
    blocks = FakeBlockManager(rng)
    flight = InFlight(anatomy, lambda: FakeRunner(blocks), stats, str, str, prefixes, torch.device("cpu"), blocks)

    def job(t: Any, chunk_tokens: int) -> TicketPrefill:
        rows = []
        for _ in range(rng.randint(1, 3)):
            length = rng.randint(1, 6 * BLOCK)
            ids = [rng.randrange(100) for _ in range(length)]
            rows.append(RowPrefill(ids, -1, (), chunk_cuts(length, chunk_tokens, [], BLOCK)))
        made = TicketPrefill(t, [], rows)
        made.prefilled = lambda config: None  # the fake runner reads no states
        made.states = lambda layers: {}
        return made

    flight._prefill_job = job
    return flight, prefixes, hashed


def finish(job: TicketPrefill) -> None:
    for row in job.rows:
        row.done = len(row.ids)


def test_a_reserved_requests_prompt_blocks_are_hashed_once_and_reused_when_it_joins():
    flight, _, hashed = flight_of(0)
    reserved, direct = ticket(), ticket()
    flight.reserve(reserved, CHUNK)
    job = flight._reserved[id(reserved)]
    assert hashed[0] == len(job.rows) and job.prompt_blocks is not None
    flight._begin_prefills([reserved, direct], CHUNK)
    other = flight.prefilling[1]
    for each in flight.prefilling:
        finish(each)
    assert flight._join_prefilled(()) == [reserved, direct]
    assert hashed[0] == len(job.rows) + len(other.rows)  # the reserved job's rows were not hashed again
    batch = flight.batch
    assert isinstance(batch, FakeRunner)
    assert batch.appended[0] is job.prompt_blocks and batch.appended[1] is other.prompt_blocks
    assert flight.reserved_total == 0 and flight.block_manager.pins == 0


@pytest.mark.parametrize("seed", range(8))
def test_the_reserved_count_equals_a_recount_after_any_sequence_of_reserves_cancels_joins_and_failures(seed):
    flight, _, _ = flight_of(seed)
    rng = random.Random(1000 + seed)
    every: list[Any] = []  # alive for the whole test: no ticket's id is reused
    admitted: list[Any] = []  # reserved at admission, not yet begun (the scheduler's step not yet run)
    peak = 0

    for _ in range(400):
        op = rng.choice(["reserve", "reserve", "unreserve", "begin", "cancel", "join", "join", "fail"])
        if op == "reserve":
            t = ticket()
            every.append(t)
            held, _ = flight.reserve(t, CHUNK)
            assert held == flight.reserved_blocks(t)
            admitted.append(t)
        elif op == "unreserve" and admitted:
            flight.unreserve(admitted.pop(rng.randrange(len(admitted))))
        elif op == "begin":
            fresh = [ticket() for _ in range(rng.randint(0, 1))]  # admitted without a reservation (whole pool room)
            every += fresh
            flight._begin_prefills([*admitted, *fresh], CHUNK)
            admitted = []
        elif op == "cancel":
            candidates = [*admitted, *(job.ticket for job in flight.prefilling), *flight.tickets]
            if candidates:
                rng.choice(candidates).handle.cancelled = True
            flight.drop_cancelled()
        elif op == "join" and flight.prefilling:
            finish(rng.choice(flight.prefilling))
            flight._join_prefilled(())
        elif op == "fail":
            flight.fail_all(RuntimeError("a failed step"), admitted)
            admitted = []

        recount = flight.recount_reserved()
        batch = flight.batch
        assert isinstance(batch, FakeRunner)
        assert flight.reserved_total == sum(recount.values()) == flight.block_manager.pins
        for t in every:
            assert flight.reserved_blocks(t) == recount.get(id(t), 0)
        peak = max(peak, flight.reserved_total)
    assert peak > 0  # blocks were held at some point: the count was exercised
