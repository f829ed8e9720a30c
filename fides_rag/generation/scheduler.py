"""The scheduler: the admission policy of the engine. It holds the waiting queue (FIFO, bounded by `max_queue`),
admits requests within the bounds on requests, rows and KV positions in flight (continuously at every step, or
'static': a batch runs to its end before the next is admitted), and gives each step its token budget: the
decodes first, one token per running row, then prefill chunks up to `max_num_batched_tokens`.

The engine runs the steps it plans (schedule, execute, update, as vLLM's engine core does).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any, Literal

from fides_rag.generation.tickets import Ticket

Admission = Literal["continuous", "static"]
MIN_BATCHED_TOKENS = 16
"""The smallest `max_num_batched_tokens`: a prefill chunk shorter than this costs a forward for too little work."""
DEFAULT_BATCHED_TOKENS = {"cpu": 512, "cuda": 2048}
"""`max_num_batched_tokens` by device type when none is given (others take the CPU's)."""


class QueueFullError(RuntimeError):
    """The engine's queue holds `max_queue` waiting requests already; try again later."""


def _bound(name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be None (no bound) or an integer >= 1, got {value!r}")
    return value


def check_batched_tokens(value: Any) -> int:
    """`max_num_batched_tokens` checked: an integer >= MIN_BATCHED_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_BATCHED_TOKENS:
        raise ValueError(
            f"max_num_batched_tokens must be an integer >= {MIN_BATCHED_TOKENS} (the smallest prefill chunk), got {value!r}"
        )
    return value


class StepBudget:
    """The tokens one step may still compute: `take(n)` says whether a prefill chunk of n tokens runs now. The
    first chunk of a step always runs (so prefill progresses under any number of decodes, and a running decode
    waits at most one chunk); later ones only within the budget."""

    def __init__(self, tokens: int) -> None:
        self.left = tokens
        self.chunks = 0

    def take(self, tokens: int) -> bool:
        if self.chunks and tokens > self.left:
            return False
        self.left -= tokens
        self.chunks += 1
        return True


class Scheduler:
    """The waiting queue and the policy that admits from it and budgets each step."""

    def __init__(self, *, max_num_batched_tokens: int, **settings: Any) -> None:
        self.queue: collections.deque[Ticket] = collections.deque()
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
        for name in ("max_requests", "max_rows", "max_tokens", "max_queue"):
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
        """Raise if `request` alone passes a bound (it could never be admitted)."""
        for name, needed, what in (("max_rows", request.rows, "batch rows"), ("max_tokens", request.tokens, "KV positions")):
            bound = getattr(self, name)
            if bound is not None and needed > bound:
                raise ValueError(
                    f"this request needs {needed} {what} (every path of every method, prompt plus max_new_tokens), "
                    f"more than the engine's {name}={bound}; raise {name} (engine.configure) or shorten the request"
                )

    def add(self, tickets: Sequence[Ticket]) -> None:
        """Queue `tickets`, or raise QueueFullError if the queue would pass max_queue."""
        if self.max_queue is not None and len(self.queue) + len(tickets) > self.max_queue:
            raise QueueFullError(f"{len(self.queue)} requests are waiting, the engine's max_queue is {self.max_queue}; retry later")
        self.queue.extend(tickets)

    def full(self) -> bool:
        """Whether the queue holds a whole batch already (an idle engine stops waiting for more arrivals)."""
        return self.max_requests is not None and len(self.queue) >= self.max_requests

    def admit(self, in_flight: Sequence[Ticket], extendable: bool, on_cancelled: Any) -> list[Ticket]:
        """The tickets that join now, FIFO within the bounds (counting `in_flight`: decoding or prefilling).
        Cancelled tickets at the head leave the queue through `on_cancelled`."""
        if in_flight and (self.admission == "static" or not extendable):
            return []
        taken: list[Ticket] = []
        requests = len(in_flight)
        rows = sum(t.request.rows for t in in_flight)
        tokens = sum(t.request.tokens for t in in_flight)
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
            self.queue.popleft()
            taken.append(ticket)
            requests, rows, tokens = requests + 1, rows + request.rows, tokens + request.tokens
        return taken

    def step_budget(self, decode_rows: int) -> StepBudget:
        """This step's budget for prefill chunks: what the decodes leave of max_num_batched_tokens."""
        return StepBudget(self.max_num_batched_tokens - decode_rows)
