"""The scheduler: every policy of the engine. It holds the waiting queue (FIFO, bounded by `max_queue`), refuses
a request that could never fit (the model's context window, the bounds), lets an idle engine wait `window_s` for
more arrivals, admits requests within the bounds on requests, rows and KV positions in flight (continuously at
every step, or 'static': a batch runs to its end before the next is admitted, and its results go out together),
and plans each step (`ScheduledStep`): its newcomers, its decodes and their bucket, and its token budget, the
decodes first, one token per running row, then prefill chunks up to `max_num_batched_tokens`. In fast mode it owns
the pool's block manager (`block_manager.py`): admission counts the blocks it can hand out, and a prompt block
several requests share once.

The engine carries out the steps it plans (schedule, execute, update, as vLLM's engine core does).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from fides_rag.errors import ContextWindowExceeded, KVPoolExceeded, QueueFullError
from fides_rag.generation.engine.block_manager import BlockManager
from fides_rag.generation.engine.captured_step import bucket_for, fits_buckets
from fides_rag.generation.engine.kv_pool_size import BLOCK
from fides_rag.generation.engine.step_plan import ScheduledStep, StepBudget
from fides_rag.generation.engine.tickets import Ticket
from fides_rag.generation.paths import longest_prompt

Admission = Literal["continuous", "static"]
MIN_BATCHED_TOKENS = 16
"""The smallest `max_num_batched_tokens`: a prefill chunk shorter than this costs a forward for too little work."""
DEFAULT_BATCHED_TOKENS = {"cpu": 512, "cuda": 2048}
"""`max_num_batched_tokens` by device type when none is given (others take the CPU's)."""


def _bound(name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be None (no bound) or an integer >= 1, got {value!r}")
    return value


BOUNDS = ("max_requests", "max_rows", "max_tokens", "max_queue")
"""The scheduler's bounds on what decodes at once and waits (each None: no bound, or an integer >= 1)."""


def check_bounds(**bounds: Any) -> None:
    """Raise if any of `BOUNDS` given is neither None nor an integer >= 1."""
    for name, value in bounds.items():
        if name not in BOUNDS:
            raise TypeError(f"unknown scheduler bound {name!r}; the bounds are {', '.join(BOUNDS)}")
        _bound(name, value)


def check_batched_tokens(value: Any) -> int:
    """`max_num_batched_tokens` checked: an integer >= MIN_BATCHED_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_BATCHED_TOKENS:
        raise ValueError(
            f"max_num_batched_tokens must be an integer >= {MIN_BATCHED_TOKENS} (the smallest prefill chunk), got "
            f"{value!r}"
        )
    return value


class Running(Protocol):
    """What the scheduler reads of the requests in flight."""

    @property
    def requests(self) -> list[Ticket]:
        """Every request admitted: decoding, or being prefilled."""

    @property
    def tickets(self) -> list[Ticket]:
        """The requests decoding."""

    @property
    def rows(self) -> int:
        """The running batch's rows."""

    @property
    def extendable(self) -> bool:
        """Whether rows can join the running batch now."""

    def pool_growth(self, block: int) -> int:
        """Blocks of fast mode's pool the decoding requests may still take (their worst case less what their rows
        hold, and the copies on write pending)."""

    def reserve(self, ticket: Ticket, chunk_tokens: int) -> tuple[int, int]:
        """Hold the kept pool blocks `ticket`'s rows would take by reference: (blocks held, of which no row held)."""

    def unreserve(self, ticket: Ticket) -> None:
        """Give back what `reserve` held for a ticket not admitted after all."""

    def reserved_blocks(self, ticket: Ticket) -> int:
        """Blocks held for an admitted request still prefilling."""


class Scheduler:
    """The waiting queue and the policy that admits from it, plans each step and releases what finished."""

    def __init__(
        self,
        *,
        max_num_batched_tokens: int,
        context_window: int | None = None,
        block_manager: BlockManager | None = None,
        buckets: tuple[int, ...] | None = None,
        **settings: Any,
    ) -> None:
        self.queue: collections.deque[Ticket] = collections.deque()
        self.context_window = context_window
        """The model's context window: a request whose prompt plus max_new_tokens passes it is refused (None: none)."""
        self.block_manager = block_manager
        """Fast mode's pool blocks: free, held and kept (None: exact mode, no pool)."""
        self.buckets = buckets
        """The row counts a decode step is padded to (a captured step's, or a static-batch backend's), or None."""
        self.held: list[Ticket] = []
        """Finished under static admission: released together when the whole batch has finished."""
        self.max_num_batched_tokens = check_batched_tokens(max_num_batched_tokens)
        self.max_requests: int | None = None
        self.max_rows: int | None = 128
        self.max_tokens: int | None = None
        self.max_queue: int | None = None
        self.window_s = 0.0
        self.admission: Admission = "continuous"
        self.configure(**settings)

    def configure(self, **settings: Any) -> None:
        """Set any of max_requests, max_rows, max_tokens (bounds on what decodes at once; None: no bound),
        max_queue (waiting requests beyond it are refused with QueueFullError), window_s (how long an idle
        engine waits for more arrivals before the first step), admission ('continuous', or 'static': a batch
        runs to its end before the next is admitted, and releases its results together, as a static batcher) and
        max_num_batched_tokens (the tokens a step computes: its decodes, then prefill chunks of at most this)."""
        for name in BOUNDS:
            if name in settings:
                setattr(self, name, _bound(name, settings.pop(name)))
        if "max_num_batched_tokens" in settings:
            self.max_num_batched_tokens = check_batched_tokens(settings.pop("max_num_batched_tokens"))
        if "window_s" in settings:
            window = settings.pop("window_s")
            if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 <= window <= 10:
                raise ValueError(f"window_s must be a number of seconds in [0, 10], got {window!r}")
            self.window_s = float(window)
        if "admission" in settings:
            admission = settings.pop("admission")
            if admission not in ("continuous", "static"):
                raise ValueError(f"admission must be 'continuous' or 'static', got {admission!r}")
            self.admission = admission
        if settings:
            raise TypeError(f"unknown engine settings {sorted(settings)}")

    def check_fits(self, request: Any) -> None:
        """Raise if `request` alone passes the context window or a bound (it could never be admitted)."""
        longest = longest_prompt(request.example)
        if self.context_window is not None and longest + request.settings.max_new_tokens > self.context_window:
            raise ContextWindowExceeded(
                longest, request.settings.max_new_tokens, self.context_window, "the prompt or documents"
            )
        if self.pool_blocks is not None and request.kv_blocks(BLOCK) > self.pool_blocks:
            raise KVPoolExceeded(
                f"this request needs {request.kv_blocks(BLOCK)} blocks of {BLOCK} positions of the fast-mode KV pool "
                f"(every "
                f"path of every method, prompt plus max_new_tokens), more than the whole pool of {self.pool_blocks} "
                f"blocks "
                f"({self.pool_blocks * BLOCK} positions); raise kv_pool_tokens or kv_cache_memory, or shorten the "
                f"request"
            )
        for name, needed, what in (
            ("max_rows", request.rows, "batch rows"),
            ("max_tokens", request.tokens, "KV positions"),
        ):
            bound = getattr(self, name)
            if bound is not None and needed > bound:
                raise ValueError(
                    f"this request needs {needed} {what} (every path of every method, prompt plus max_new_tokens), "
                    f"more than the engine's {name}={bound}; raise {name} (engine.configure) or shorten the request"
                )

    def add(self, tickets: Sequence[Ticket]) -> None:
        """Queue `tickets`, or raise QueueFullError if the queue would pass max_queue."""
        if self.max_queue is not None and len(self.queue) + len(tickets) > self.max_queue:
            raise QueueFullError(
                f"{len(self.queue)} requests are waiting, the engine's max_queue is {self.max_queue}; retry later"
            )
        self.queue.extend(tickets)

    def full(self) -> bool:
        """Whether the queue holds a whole batch already (an idle engine stops waiting for more arrivals)."""
        return self.max_requests is not None and len(self.queue) >= self.max_requests

    def admit(self, running: Running, on_cancelled: Any, chunk_tokens: int | None = None) -> list[Ticket]:
        """The tickets that join now, FIFO within the bounds (counting the requests in flight: decoding or
        prefilling). Cancelled tickets at the head leave the queue through `on_cancelled`.

        Fast mode's pool: a newcomer's worst-case blocks (every row its own) must fit in what the pool can hand out
        now, less what the decoding requests may still take and the worst case of those prefilling. With chunked
        prefill (`chunk_tokens`), the kept blocks a newcomer's rows would take by reference are held for it at
        admission and not counted against it: a block several requests share is counted once."""
        if not self.queue:
            return []  # nothing waits: no bound to count (a decode step's common case)
        in_flight = running.requests
        if in_flight and (self.admission == "static" or not running.extendable):
            return []
        taken: list[Ticket] = []
        requests = len(in_flight)
        rows = sum(t.request.rows for t in in_flight)
        tokens = sum(t.request.tokens for t in in_flight)
        manager = self.block_manager
        blocks = 0  # of the pool's, those not left for the head of the queue
        if manager is not None:
            joined = {id(t) for t in running.tickets}
            blocks = manager.blocks - manager.available + running.pool_growth(BLOCK)
            blocks += sum(
                t.request.kv_blocks(BLOCK) - running.reserved_blocks(t) for t in in_flight if id(t) not in joined
            )
        while self.queue:
            ticket = self.queue[0]
            if ticket.handle.cancelled:
                self.queue.popleft()
                on_cancelled(ticket)
                continue
            request = ticket.request
            over = (
                (self.max_requests is not None and requests + 1 > self.max_requests)
                or (self.max_rows is not None and rows + request.rows > self.max_rows)
                or (self.max_tokens is not None and tokens + request.tokens > self.max_tokens)
            )
            if over and (in_flight or taken):
                break  # FIFO: the head waits for room, and nobody passes it
            needs, reserved = 0, False
            if manager is not None:
                needs = request.kv_blocks(BLOCK)
                if chunk_tokens is not None:
                    held, unheld = running.reserve(ticket, chunk_tokens)
                    needs, reserved = needs - held + unheld, True
                if blocks + needs > manager.blocks:
                    if reserved:
                        running.unreserve(ticket)
                    break  # the pool's blocks are a hard bound: the head waits for blocks to free, even alone
            self.queue.popleft()
            taken.append(ticket)
            requests, rows, tokens = requests + 1, rows + request.rows, tokens + request.tokens
            blocks += needs
        return taken

    def step_budget(self, decode_rows: int) -> StepBudget:
        """This step's budget for prefill chunks: what the decodes leave of max_num_batched_tokens."""
        return StepBudget(self.max_num_batched_tokens - decode_rows)

    @property
    def pool_blocks(self) -> int | None:
        """Fast mode's KV pool in blocks (a request is admitted when all its rows' blocks fit), or None: no pool."""
        return self.block_manager.blocks if self.block_manager is not None else None

    def bucket(self, rows: int) -> int:
        """The row count a decode of `rows` rows runs at: the smallest captured bucket that holds them, else `rows`."""
        buckets = self.buckets or ()
        return bucket_for(rows, buckets) if fits_buckets(rows, buckets) else rows

    def schedule(
        self,
        running: Running,
        *,
        chunked: bool,
        wait_for: Callable[[Callable[[], bool], float], Any],
        on_cancelled: Callable[[Ticket], None],
    ) -> ScheduledStep:
        """Plan the next step: an idle engine first waits up to `window_s` for a whole batch to arrive (`wait_for`,
        the engine's condition wait), then the newcomers are admitted, and the decodes and the budget are set.
        `chunked`: prompts are prefilled in chunks under the budget (else whole, at admission)."""
        if not running.requests and self.window_s > 0:  # an idle engine gathers concurrent arrivals
            wait_for(self.full, self.window_s)
        newcomers = self.admit(running, on_cancelled, self.max_num_batched_tokens if chunked else None)
        rows = running.rows
        return ScheduledStep(
            newcomers=newcomers,
            decodes=list(running.tickets),
            decode_rows=rows,
            bucket=self.bucket(rows),
            chunk_tokens=self.max_num_batched_tokens,
            budget=self.step_budget(rows) if chunked else None,
        )

    def release(self, finished: Sequence[Ticket], running: bool) -> list[Ticket]:
        """Of the requests that finished at a step, those whose results go out now: every one under continuous
        admission; under static admission, the whole batch together once nothing of it is `running`."""
        now = [] if self.admission == "static" else list(finished)
        if self.admission == "static":
            self.held += finished
        if not running and self.held:
            now += self.held
            self.held = []
        return now

    def drop_held(self) -> list[Ticket]:
        """The finished requests held back so far, no longer held (a failed step fails them with the rest)."""
        held, self.held = self.held, []
        return held
