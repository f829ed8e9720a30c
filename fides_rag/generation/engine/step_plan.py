"""The scheduler's step plan: what one engine step computes, decided by the scheduler before the step runs and
carried out by the engine. A step admits its newcomers, decodes one token of every running row (at the plan's
bucket), and runs prefill chunks within its token budget: the decodes take their tokens first, then chunks in
FIFO order (request, then row), the first chunk of a step always."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fides_rag.generation.engine.tickets import Ticket


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


@dataclass(frozen=True)
class PrefillChunk:
    """One prefill forward: prompt tokens [start, end) of one row of one admitted request."""

    job: Any
    """The request's prefill (`prefilling.TicketPrefill`)."""
    row: Any
    """The prompt row (`prefilling.RowPrefill`) the chunk extends."""
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass
class ScheduledStep:
    """What one step computes."""

    newcomers: list[Ticket]
    """Requests admitted at this step, in FIFO order."""
    decodes: list[Ticket]
    """Requests whose rows decode one token at this step (those decoding when it was planned)."""
    decode_rows: int
    """Rows of the decode forward."""
    bucket: int
    """The row count the decode forward runs at: `decode_rows`, or the next batch size where sizes are fixed."""
    chunk_tokens: int
    """The longest prefill chunk; prompts are cut at its multiples."""
    budget: StepBudget | None
    """Tokens left for prefill chunks after the decodes; None: the newcomers' prompts are prefilled whole, in one
    forward at this step, and no chunk runs."""

    @property
    def prefill_whole(self) -> bool:
        """Whether the newcomers are prefilled in one forward now (else chunk by chunk, `prefill_chunks`)."""
        return self.budget is None

    def prefill_chunks(self, jobs: Sequence[Any], start: Callable[[Any], None]) -> Iterator[PrefillChunk]:
        """The chunks this step runs, FIFO over `jobs` (the requests being prefilled, then their rows) while the
        budget lasts. The engine runs each chunk before asking for the next; `start(row)` begins a row (finds its
        cached prefix, which may be one an earlier chunk of this step stored), so a row's chunk is sized then."""
        if self.budget is None:
            return
        for job in jobs:
            for row in job.pending():
                while not row.finished:
                    if not row.started:
                        start(row)
                    end = row.next_cut()
                    if not self.budget.take(end - row.done):
                        return
                    before = row.done
                    yield PrefillChunk(job, row, before, end)
                    if row.done == before:
                        raise RuntimeError(
                            "a planned prefill chunk was not run: run each chunk before asking for the next"
                        )
