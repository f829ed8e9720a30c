"""The requests in flight and one step of their decode: newcomers join (their prompts prefilled, their rows
appended), every row advances one token (one forward, one head matmul, each lane's rule and choice, one host
transfer), and each request that finished is released with its result; rows of finished or cancelled requests
leave the batch."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ContextManager

from fides_rag.generation.gather import StepPlan
from fides_rag.generation.hooks import HeadMasker, LayerCapture
from fides_rag.generation.lanes import Lanes
from fides_rag.generation.layout import Unit, prefill_groups
from fides_rag.generation.requests import Heads
from fides_rag.generation.running import RunningBatch
from fides_rag.generation.step import advance, decide
from fides_rag.generation.tickets import Ticket
from fides_rag.lens import ModelAnatomy


class InFlight:
    """The running decode's requests (tickets), their lanes and rows; `step` advances them all by one token."""

    def __init__(self, anatomy: ModelAnatomy, batch: Callable[[], RunningBatch], stats: Any, decode: Callable[[list[int]], str],
                 decode_token: Callable[[list[int]], str]) -> None:
        self.anatomy = anatomy
        self.stats = stats
        self._new_batch = batch
        self._decode, self._decode_token = decode, decode_token
        self.batch = batch()
        self.lanes = Lanes(anatomy.num_layers)
        self.tickets: list[Ticket] = []
        self.held: list[Ticket] = []
        """Finished under static admission: released together when the whole batch has finished."""
        self.static = False
        self.head_sets: list[Heads] = []
        self._masker: HeadMasker | None = None
        self._masker_sets = 0
        self._plan: StepPlan | None = None
        self._plan_version = -1

    def head_set(self, heads: Heads) -> int:
        """The index of a set of masked heads (registered on first use)."""
        key = tuple(heads.items())
        keys = [tuple(h.items()) for h in self.head_sets]
        if key in keys:
            return keys.index(key)
        self.head_sets.append(dict(heads))
        return len(self.head_sets) - 1

    def step(self, newcomers: list[Ticket], eos_token_ids: set[int], dtype: Any) -> None:
        """Admit `newcomers`, advance every request one token, release those that finished."""
        self.drop_cancelled()
        for ticket in newcomers:
            for unit in ticket.units:
                unit.ticket = ticket
                self.lanes.add(unit, ticket.request.decoded[unit.index].effective, ticket.request.settings, unit.head_set)
            self.tickets.append(ticket)
        if not self.tickets:
            return
        batch = self.batch
        old_units = [u for t in self.tickets if t not in newcomers for u in t.units if u.finish_reason is None]
        state_layers, layers = self.lanes.capture_layers()
        with LayerCapture(self.anatomy, layers) as capture, self._masking() as masker:
            if not batch.empty:
                batch.forward(batch.layout.next_tokens(old_units), capture, masker)
            if newcomers:
                units = [(u, t.request.example, u.head_set) for t in newcomers for u in t.units]
                groups, head_sets = prefill_groups(units, batch.layout.num_rows)
                batch.join(groups, head_sets, capture, masker)
                self.stats.admissions += 1
        if self._plan is None or self._plan_version != batch.layout.version:
            self._plan, self._plan_version = StepPlan(list(self.lanes), batch.layout.num_rows), batch.layout.version
        host, lane_steps = decide(self.anatomy, batch, list(self.lanes), self._plan, state_layers)
        failed = advance(host, lane_steps, self._decode_token, eos_token_ids, dtype)
        self.stats.steps += 1
        self.stats.tokens += sum(len(s.units) for s in lane_steps) - len(failed)
        self.stats.largest_batch = max(self.stats.largest_batch, len(self.tickets))
        self.stats.peak_rows = max(self.stats.peak_rows, batch.layout.num_rows)
        self._settle(failed)
        self._compact()

    def _masking(self) -> ContextManager[HeadMasker | None]:
        """The head masker over every set of heads registered so far (rebuilt when a new set arrives)."""
        if not self.head_sets:
            return contextlib.nullcontext()
        if self._masker is None or self._masker_sets != len(self.head_sets):
            self._masker, self._masker_sets = HeadMasker(self.anatomy, list(self.head_sets)), len(self.head_sets)
        return self._masker

    def _settle(self, failed: list[tuple[Unit, BaseException]]) -> None:
        """Fail the requests of failed units, stream new text, release every request that finished."""
        for unit, error in failed:
            ticket = unit.ticket
            if ticket in self.tickets and not ticket.handle.done():
                ticket.fail(error)
                self.stats.failed += 1
            for other in ticket.units:
                other.finish_reason = other.finish_reason or "cancelled"
        still: list[Ticket] = []
        for ticket in self.tickets:
            if ticket.handle.done() and not ticket.handle.cancelled:  # failed just now
                continue
            ticket.stream_delta()
            if not ticket.finished:
                still.append(ticket)
            elif self.static:
                self.held.append(ticket)
            else:
                self._release(ticket)
        self.tickets = still
        if not still and self.held:
            for ticket in self.held:
                self._release(ticket)
            self.held = []

    def _release(self, ticket: Ticket) -> None:
        if ticket.handle.cancelled:
            ticket.close_cancelled()
            self.stats.cancelled += 1
            return
        ticket.deliver(self._decode)
        self.stats.finished += 1

    def drop_cancelled(self) -> None:
        """Requests cancelled since the last step leave before the next forward."""
        cancelled = [t for t in self.tickets if t.handle.cancelled]
        if not cancelled:
            return
        for ticket in cancelled:
            for unit in ticket.units:
                unit.finish_reason = unit.finish_reason or "cancelled"
            ticket.close_cancelled()
            self.stats.cancelled += 1
        self.tickets = [t for t in self.tickets if t not in cancelled]
        self._compact()

    def _compact(self) -> None:
        """Rows of units that stopped leave the batch; lanes keep only units still decoding."""
        active = [u for t in self.tickets for u in t.units if u.finish_reason is None]
        self.batch.keep(self.batch.layout.compact(active))
        self.lanes.keep(lambda unit: unit.finish_reason is None)

    def fail_all(self, error: BaseException, newcomers: list[Ticket]) -> None:
        """A step failed outside any one rule (the forward itself): fail every request it held, start clean."""
        for ticket in [*self.tickets, *(t for t in newcomers if t not in self.tickets), *self.held]:
            ticket.fail(error)
            self.stats.failed += 1
        self.tickets, self.held = [], []
        self.batch = self._new_batch()
        self.lanes = Lanes(self.anatomy.num_layers)
        self._plan = None
