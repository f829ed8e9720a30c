"""The requests in flight and one step of their decode: newcomers join (their prompts prefilled, their rows
appended), every row advances one token (one forward, one head matmul, each lane's rule and choice, one host
transfer), and each request that finished is released with its result; rows of finished or cancelled requests
leave the batch."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ContextManager

import torch

from fides_rag.generation.gather import StepPlan
from fides_rag.generation.hooks import HeadMasker, LayerCapture
from fides_rag.generation.lanes import Lanes
from fides_rag.generation.layout import Unit, prefill_groups
from fides_rag.generation.prefilling import TicketPrefill, row_prefills
from fides_rag.generation.prefix_cache import PrefixCache
from fides_rag.generation.requests import Heads
from fides_rag.generation.running import RunningBatch
from fides_rag.generation.scheduler import StepBudget
from fides_rag.generation.step import advance, decide
from fides_rag.generation.tickets import Ticket
from fides_rag.method.lens import ModelAnatomy


class InFlight:
    """The running decode's requests (tickets), their lanes and rows; `step` advances them all by one token."""

    def __init__(self, anatomy: ModelAnatomy, batch: Callable[[], RunningBatch], stats: Any, decode: Callable[[list[int]], str],
                 decode_token: Callable[[list[int]], str], prefixes: PrefixCache, input_device: torch.device) -> None:
        self.anatomy = anatomy
        self.prefixes = prefixes
        self.input_device = input_device
        self.chunk_tokens = 0
        """The longest prefill chunk (the scheduler's max_num_batched_tokens), set before each step."""
        self.prefilling: list[TicketPrefill] = []
        """Admitted requests whose prompts are being prefilled, in order of admission."""
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

    @property
    def requests(self) -> list[Ticket]:
        """Every request in flight: decoding, or being prefilled."""
        return [*self.tickets, *(job.ticket for job in self.prefilling)]

    def step(self, newcomers: list[Ticket], eos_token_ids: set[int], dtype: Any, budget: StepBudget | None = None) -> None:
        """Admit `newcomers`, advance every decoding request one token, release those that finished.

        With a `budget` the newcomers' prompts are prefilled in chunks, after the decodes, over as many steps as the
        budget needs, and a request starts decoding at the step its last chunk ran; without, in one forward now."""
        self.drop_cancelled()
        whole = [] if budget is not None else newcomers
        if budget is not None:
            self.prefilling += [self._prefill_job(t) for t in newcomers]
        for ticket in whole:
            self._wire(ticket, 0)
        if not self.tickets and not self.prefilling:
            return
        batch = self.batch
        old_units = [u for t in self.tickets if t not in whole for u in t.units if u.finish_reason is None]
        state_layers, layers = self.lanes.capture_layers([r.effective for j in self.prefilling for r in j.ticket.request.decoded])
        with LayerCapture(self.anatomy, layers) as capture, self._masking() as masker:
            if not batch.empty:
                batch.forward(batch.layout.next_tokens(old_units), capture, masker)
            if whole:
                units = [(u, t.request.example, u.head_set) for t in whole for u in t.units]
                groups, head_sets = prefill_groups(units, batch.layout.num_rows)
                batch.join(groups, head_sets, capture, masker)
            if budget is not None:
                self._prefill_chunks(budget, capture, masker)
        joined = whole + self._join_prefilled(layers)
        if joined:
            self.stats.admissions += 1
        if not self.tickets:
            return
        state_layers, _ = self.lanes.capture_layers()
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

    def _wire(self, ticket: Ticket, row_offset: int) -> None:
        """A ticket's units join their lanes and the decode (their rows, numbered from 0, moved by `row_offset`)."""
        for unit in ticket.units:
            unit.ticket = ticket
            unit.rows = {path: [r + row_offset for r in rows] for path, rows in unit.rows.items()}
            self.lanes.add(unit, ticket.request.decoded[unit.index].effective, ticket.request.settings, unit.head_set)
        self.tickets.append(ticket)

    def _prefill_job(self, ticket: Ticket) -> TicketPrefill:
        example = ticket.request.example
        units = [(u, example, u.head_set) for u in ticket.units]
        groups, _ = prefill_groups(units, 0)  # rows numbered from 0 until the request joins
        references = [example.context_ids, example.no_context_ids, *example.template_prefixes]
        rows = row_prefills(groups, self.chunk_tokens, references, self.head_sets, self.prefixes.block_size)
        self.stats.prompt_tokens += sum(len(r.ids) for r in rows)
        return TicketPrefill(ticket, groups, rows)

    def _prefill_chunks(self, budget: StepBudget, capture: LayerCapture, masker: HeadMasker | None) -> None:
        """Prefill chunks in FIFO order (request, then row) while the step's budget lasts."""
        for job in self.prefilling:
            for row in job.pending():
                while not row.finished:
                    if not row.started:
                        row.start(self.anatomy, self.prefixes)
                    if not budget.take(row.next_cut() - row.done):
                        return
                    self.stats.prefill_tokens += row.run_chunk(self.anatomy, self.input_device, capture, masker, self.prefixes)

    def _join_prefilled(self, layers: tuple[int, ...]) -> list[Ticket]:
        """Requests whose every row is prefilled join the decode (their rows after the current ones)."""
        done = [job for job in self.prefilling if job.finished]
        for job in done:
            offset = self.batch.layout.num_rows
            self._wire(job.ticket, offset)
            head_sets = [g.head_set for g in job.groups for _ in g.sequences]
            self.batch.append(job.prefilled(self.anatomy.config), job.states(layers), head_sets, [len(r.ids) for r in job.rows])
        self.prefilling = [job for job in self.prefilling if not job.finished]
        return [job.ticket for job in done]

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
        if not still and not self.prefilling and self.held:  # a static batch: released together
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
        for job in [j for j in self.prefilling if j.ticket.handle.cancelled]:
            self.prefilling.remove(job)
            job.ticket.close_cancelled()
            self.stats.cancelled += 1
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
        prefilling = [job.ticket for job in self.prefilling]
        for ticket in [*self.tickets, *prefilling, *(t for t in newcomers if t not in self.tickets and t not in prefilling), *self.held]:
            ticket.fail(error)
            self.stats.failed += 1
        self.tickets, self.held, self.prefilling = [], [], []
        self.batch = self._new_batch()
        self.lanes = Lanes(self.anatomy.num_layers)
        self._plan = None
