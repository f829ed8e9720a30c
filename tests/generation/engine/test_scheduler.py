"""The scheduler's step budget: decodes first, then prefill chunks within max_num_batched_tokens, the first chunk
of a step always (so prefill progresses and a running decode waits at most one chunk); and the step plan it returns:
newcomers, decodes, bucket and the chunks the budget allows, the idle window, the context-window fit and static
release."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fides_rag.generation.engine.block_manager import BlockManager, PromptBlocks
from fides_rag.generation.engine.captured_step import CapturedStep, bucket_for, fits_buckets
from fides_rag.generation.engine.kv_pool_size import BLOCK
from fides_rag.generation.engine.pooled_store import PoolSettings
from fides_rag.generation.engine.prefilling import chunk_cuts
from fides_rag.generation.engine.scheduler import Scheduler


def test_decodes_take_their_tokens_first_and_chunks_fill_the_rest():
    budget = Scheduler(max_num_batched_tokens=64).step_budget(decode_rows=24)
    assert budget.take(32) and not budget.take(16) and budget.take(8)


def test_the_first_chunk_of_a_step_runs_even_past_the_budget():
    budget = Scheduler(max_num_batched_tokens=64).step_budget(decode_rows=100)
    assert budget.take(64) and not budget.take(1)


def test_chunks_are_cut_at_anchors_and_multiples_of_the_chunk_size():
    assert chunk_cuts(100, 32, anchors=[10, 0, 100, 40]) == [10, 32, 40, 64, 96, 100]
    assert chunk_cuts(20, 32, anchors=[]) == [20]


@pytest.mark.parametrize(
    "setting", [{"max_requests": 0}, {"window_s": -1}, {"admission": "eager"}, {"max_num_batched_tokens": 8}]
)
def test_bad_settings_are_refused(setting):
    with pytest.raises(ValueError):
        Scheduler(**{"max_num_batched_tokens": 64, **setting})


def ticket(rows: int = 1, tokens: int = 10) -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(rows=rows, tokens=tokens), handle=SimpleNamespace(cancelled=False))


def running(tickets=(), rows: int = 0) -> SimpleNamespace:
    return SimpleNamespace(requests=list(tickets), tickets=list(tickets), rows=rows, extendable=True)


def never_wait(predicate, timeout):
    raise AssertionError("the scheduler waited for arrivals while requests were in flight")


class FakeRow:
    """A prompt row cut at `cuts`, whose first `cached` tokens come from the prefix cache once it starts."""

    def __init__(self, cuts: list[int], cached: int = 0) -> None:
        self.cuts, self.cached, self.done, self.started = cuts, cached, 0, False

    @property
    def finished(self) -> bool:
        return self.done == self.cuts[-1]

    def next_cut(self) -> int:
        return next(c for c in self.cuts if c > self.done)


class FakeJob:
    def __init__(self, *rows: FakeRow) -> None:
        self.rows = list(rows)

    def pending(self) -> list[FakeRow]:
        return [r for r in self.rows if not r.finished]


def start(row: FakeRow) -> None:
    row.started, row.done = True, row.cached


def run_plan_chunks(plan, jobs) -> list[tuple[int, int, int]]:
    rows = [r for job in jobs for r in job.rows]
    ran = []
    for chunk in plan.prefill_chunks(jobs, start):
        ran.append((rows.index(chunk.row), chunk.start, chunk.end))
        chunk.row.done = chunk.end
    return ran


def test_a_step_plan_names_its_newcomers_decodes_bucket_and_budget():
    scheduler = Scheduler(max_num_batched_tokens=64, max_requests=3)
    decoding = ticket(rows=2)
    waiting = [ticket() for _ in range(4)]
    scheduler.add(waiting)
    plan = scheduler.schedule(running([decoding], rows=2), chunked=True, wait_for=never_wait, on_cancelled=print)
    assert plan.newcomers == waiting[:2] and list(scheduler.queue) == waiting[2:]
    assert plan.decodes == [decoding] and plan.decode_rows == plan.bucket == 2
    assert not plan.prefill_whole and plan.budget.left == 62 and plan.chunk_tokens == 64
    whole = scheduler.schedule(running(), chunked=False, wait_for=never_wait, on_cancelled=print)
    assert (
        whole.prefill_whole
        and whole.newcomers == waiting[2:]
        and list(whole.prefill_chunks([FakeJob(FakeRow([8]))], start)) == []
    )


def test_an_idle_engine_waits_its_window_for_a_whole_batch_and_a_busy_one_never():
    scheduler = Scheduler(max_num_batched_tokens=64, window_s=0.5, max_requests=2)
    waits = []
    scheduler.add([ticket()])
    scheduler.schedule(running(), chunked=True, wait_for=lambda full, s: waits.append((full(), s)), on_cancelled=print)
    assert waits == [(False, 0.5)]
    scheduler.schedule(running([ticket()], rows=1), chunked=True, wait_for=never_wait, on_cancelled=print)


def test_chunks_run_fifo_within_the_budget_each_sized_once_its_row_has_started():
    plan = Scheduler(max_num_batched_tokens=64).schedule(
        running([ticket(rows=4)], rows=4), chunked=True, wait_for=never_wait, on_cancelled=print
    )
    first = FakeJob(FakeRow([16, 40], cached=16), FakeRow([50, 100]))
    second = FakeJob(FakeRow([8]))
    # 60 tokens after the decodes: the first row's uncached 24, then the next row's 50 waits, and nobody passes it
    assert run_plan_chunks(plan, [first, second]) == [(0, 16, 40)]


def test_the_first_chunk_of_a_step_runs_past_the_budget_and_the_next_waits():
    plan = Scheduler(max_num_batched_tokens=16).schedule(
        running([ticket(rows=10)], rows=10), chunked=True, wait_for=never_wait, on_cancelled=print
    )
    assert run_plan_chunks(plan, [FakeJob(FakeRow([32, 40]))]) == [(0, 0, 32)]


def test_static_admission_releases_a_batch_together_and_continuous_at_once():
    static = Scheduler(max_num_batched_tokens=64, admission="static")
    a, b = ticket(), ticket()
    assert static.release([a], running=True) == []
    assert static.release([b], running=False) == [a, b] and static.release([], running=False) == []
    assert Scheduler(max_num_batched_tokens=64).release([a], running=True) == [a]


def test_a_request_past_the_context_window_is_refused_naming_what_to_shorten():
    scheduler = Scheduler(max_num_batched_tokens=64, context_window=100)
    example = SimpleNamespace(context_ids=[0] * 90, no_context_ids=[0] * 10, document_ids=None)
    request = SimpleNamespace(example=example, settings=SimpleNamespace(max_new_tokens=20), rows=2, tokens=140)
    with pytest.raises(ValueError, match="90 tokens plus max_new_tokens=20 exceeds the context window of 100"):
        scheduler.check_fits(request)
    request.settings.max_new_tokens = 10
    scheduler.check_fits(request)


def test_the_plans_bucket_is_the_smallest_captured_size_that_holds_the_decodes():
    scheduler = Scheduler(max_num_batched_tokens=64)
    assert [scheduler.bucket(r) for r in (1, 3, 40)] == [1, 3, 40]  # no captured step: the rows themselves
    scheduler.buckets = (1, 2, 4, 8, 16, 32)
    assert [scheduler.bucket(r) for r in (1, 3, 9, 32, 40)] == [1, 4, 16, 32, 40]  # past the largest: eager, as is


def test_one_bucket_lookup_serves_the_scheduler_the_pool_and_the_captured_step():
    buckets = (1, 2, 4, 8, 16, 32)
    assert [bucket_for(r, buckets) for r in (0, 1, 3, 9, 32)] == [1, 1, 4, 16, 32]
    assert fits_buckets(32, buckets) and not fits_buckets(33, buckets) and not fits_buckets(1, ())
    with pytest.raises(RuntimeError, match="33 rows, more than the largest bucket 32: max_rows caps"):
        bucket_for(33, buckets)
    settings = PoolSettings(max_rows=32, max_row_blocks=4, attention="gather", buckets=buckets)
    assert settings.bucket(9) == 16
    with pytest.raises(RuntimeError, match="more than the largest bucket 32"):
        settings.bucket(33)
    captured = SimpleNamespace(buckets=buckets)
    assert CapturedStep.bucket(captured, 9) == 16 and CapturedStep.bucket(captured, 33) is None  # past: eager


class PinningFlight:
    """The requests in flight as admission reads them, with a pool: `shared` kept blocks pinned for each newcomer in
    the scheduler's block manager (as `InFlight.reserve` pins them)."""

    def __init__(self, manager: BlockManager, shared: list[int]) -> None:
        self.manager, self.shared = manager, shared
        self.requests: list = []
        self.tickets: list = []
        self.rows, self.extendable = 0, True

    def pool_growth(self, block: int) -> int:
        return 0

    def reserve(self, ticket, chunk_tokens: int) -> tuple[int, int]:
        pinned, unheld = self.manager.pin([PromptBlocks(hashes=[b"doc"], cut_blocks=[1])] if self.shared else [])
        ticket.pinned = pinned
        return sum(len(p) for p in pinned), unheld

    def unreserve(self, ticket) -> None:
        self.manager.unpin(ticket.pinned)

    def reserved_blocks(self, ticket) -> int:
        return sum(len(p) for p in getattr(ticket, "pinned", []))


def pool_ticket(blocks: int) -> SimpleNamespace:
    request = SimpleNamespace(rows=1, tokens=blocks * BLOCK, kv_blocks=lambda block: blocks)
    return SimpleNamespace(request=request, handle=SimpleNamespace(cancelled=False))


@pytest.mark.parametrize("shared", [False, True])
def test_the_scheduler_admits_by_its_block_manager_and_counts_a_pinned_shared_block_once(shared):
    manager = BlockManager(7)
    kept = manager.take(1)
    manager.keep([b"doc"], kept)
    manager.release(kept)  # a document's block, kept from an earlier request
    scheduler = Scheduler(max_num_batched_tokens=64, block_manager=manager)
    assert scheduler.pool_blocks == 7
    waiting = [pool_ticket(4), pool_ticket(4)]  # 4 blocks each, one of them the document's
    scheduler.add(waiting)
    admitted = scheduler.admit(PinningFlight(manager, [1] if shared else []), print, chunk_tokens=64)
    assert admitted == (waiting if shared else waiting[:1])  # 4 + 3 fit in 7; 4 + 4 do not
    assert manager.refs[kept[0]] == (3 if shared else 1)  # kept, and pinned for each newcomer
