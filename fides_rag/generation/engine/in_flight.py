"""The requests in flight and one step of their decode, carried out as the scheduler planned it
(`step_plan.ScheduledStep`): newcomers join (their prompts prefilled, their rows appended), every row advances one
token (one forward, one head matmul, each lane's rule and choice, one host transfer), and each request that
finished goes to the scheduler, which says when its result is released; rows of finished or cancelled requests
leave the batch."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from fides_rag.generation.engine.block_manager import BlockManager, PromptBlocks
from fides_rag.generation.engine.end_tokens import EndTokens
from fides_rag.generation.engine.hooks import HeadMasker, LayerCapture
from fides_rag.generation.engine.kv_pool_size import BLOCK
from fides_rag.generation.engine.lane_inputs import LaneInputs
from fides_rag.generation.engine.lanes import Lanes
from fides_rag.generation.engine.layout import Unit, prefill_groups
from fides_rag.generation.engine.prefilling import RowPrefill, TicketPrefill, row_prefills
from fides_rag.generation.engine.prefix_cache import PrefixCache
from fides_rag.generation.engine.runner import Runner
from fides_rag.generation.engine.step import advance, decide
from fides_rag.generation.engine.step_plan import ScheduledStep
from fides_rag.generation.engine.tickets import Ticket
from fides_rag.generation.paths import Heads, prefill_anchors
from fides_rag.method.lens import ModelAnatomy


class InFlight:
    """The running decode's requests (tickets), their lanes and rows; `step` advances them all by one token."""

    def __init__(
        self,
        anatomy: ModelAnatomy,
        batch: Callable[[], Runner],
        stats: Any,
        decode: Callable[[list[int]], str],
        decode_token: Callable[[list[int]], str],
        prefixes: PrefixCache,
        input_device: torch.device,
        block_manager: BlockManager | None = None,
    ) -> None:
        self.anatomy = anatomy
        self.block_manager = block_manager
        """Fast mode's pool blocks (the scheduler's): pins for admitted requests are taken here (None: no pool)."""
        self.prefixes = prefixes
        self.input_device = input_device
        self.prefilling: list[TicketPrefill] = []
        """Admitted requests whose prompts are being prefilled, in order of admission."""
        self.stats = stats
        self._new_batch = batch
        self._decode, self._decode_token = decode, decode_token
        self.batch = batch()
        self.lanes = Lanes(anatomy.num_layers)
        self.tickets: list[Ticket] = []
        self.head_sets: list[Heads] = []
        self._masker: HeadMasker | None = None
        self._masker_sets = 0
        self._end_tokens = EndTokens(decode_token)
        self._lane_inputs: LaneInputs | None = None
        self._lane_inputs_version = -1
        self._reserved: dict[int, TicketPrefill] = {}
        """Admitted requests' prefill jobs made at admission (their shared blocks held), by id of ticket."""
        self._held_blocks: dict[int, int] = {}
        """Blocks held for each request admitted and not yet joined (its job's pins), by id of ticket."""

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

    @property
    def rows(self) -> int:
        """The running batch's rows."""
        return self.batch.layout.num_rows

    @property
    def pool_used_tokens(self) -> int:
        """Positions of the KV pool's blocks the running rows hold (0: no pool)."""
        pool = self.batch.pool
        return pool.used_tokens if pool is not None else 0

    def reserve(self, ticket: Ticket, chunk_tokens: int) -> tuple[int, int]:
        """At `ticket`'s admission (chunked prefill): hold the kept pool blocks its rows would take by reference now,
        so that they stay until it joins. Returns how many blocks are held for it, and how many of those no row held
        (they were available until now)."""
        job = self._prefill_job(ticket, chunk_tokens)
        self._reserved[id(ticket)] = job
        prompts = self._prompt_blocks(job)
        if self.block_manager is None or prompts is None:
            return 0, 0
        pinned, unheld = self.block_manager.pin(prompts)
        return self._hold(job, pinned), unheld

    def unreserve(self, ticket: Ticket) -> None:
        """A reserved ticket not admitted after all: its held blocks go back."""
        job = self._reserved.pop(id(ticket))
        self._release_pins(job)
        self.stats.prompt_tokens -= sum(len(r.ids) for r in job.rows)  # counted again when it is admitted

    def reserved_blocks(self, ticket: Ticket) -> int:
        """Blocks held for a request still prefilling (0: none); O(1), from the count kept as pins change."""
        return self._held_blocks.get(id(ticket), 0)

    @property
    def reserved_total(self) -> int:
        """Blocks held for every request admitted and not yet joined (the sum of `reserved_blocks`)."""
        return sum(self._held_blocks.values())

    def recount_reserved(self) -> dict[int, int]:
        """Blocks held per request (by id of ticket), recounted from the jobs' pins: what the kept count must equal."""
        jobs = [*self._reserved.values(), *self.prefilling]
        return {id(job.ticket): sum(len(b) for b in job.pinned) for job in jobs if job.pinned}

    def _hold(self, job: TicketPrefill, pinned: list[list[int]]) -> int:
        """`job`'s pins are `pinned` (held in the pool already); returns how many blocks they are."""
        self._drop_hold(job)
        job.pinned = pinned
        count = sum(len(blocks) for blocks in pinned)
        if count:
            self._held_blocks[id(job.ticket)] = count
        return count

    def _drop_hold(self, job: TicketPrefill) -> None:
        """`job` holds no pins any more (given back, or taken over by its rows): the count forgets them."""
        self._held_blocks.pop(id(job.ticket), None)
        job.pinned = None

    def _release_pins(self, job: TicketPrefill) -> None:
        if job.pinned and self.block_manager is not None:
            self.block_manager.unpin(job.pinned)
        self._drop_hold(job)

    def pool_growth(self, block: int) -> int:
        """Blocks the decoding requests' rows may still take from the pool: each request's worst case (every row its
        own) less the blocks its rows hold (a shared block included), plus the copies on write pending (0: no pool
        yet)."""
        pool = self.batch.pool
        if pool is None:
            return 0
        growth = 0
        for ticket in self.tickets:
            rows = [r for u in ticket.units if u.finish_reason is None for rs in u.rows.values() for r in rs]
            growth += max(0, ticket.request.kv_blocks(block) - pool.blocks_held(rows))
        return growth + pool.pending_copies()

    @property
    def extendable(self) -> bool:
        """Whether rows can join the running batch now."""
        return self.batch.extendable

    def step(
        self,
        plan: ScheduledStep,
        eos_token_ids: set[int],
        dtype: Any,
        release: Callable[[Sequence[Ticket], bool], list[Ticket]],
    ) -> None:
        """Carry out `plan`: admit its newcomers, advance every decoding request one token, hand those that finished
        to `release` (the scheduler's: which results go out now).

        Prefilled whole, the newcomers join in one forward now; else their prompts are prefilled in the plan's
        chunks, after the decodes, over as many steps as the budget needs, and a request starts decoding at the step
        its last chunk ran."""
        self.drop_cancelled()
        # The decode forward hooks only the layers its own rows' rules read, so its hook set (part of a captured
        # step's graph) follows the rows it runs, never a request still being prefilled.
        _, decode_layers = self.lanes.capture_layers()
        whole = plan.newcomers if plan.prefill_whole else []
        if not plan.prefill_whole:
            self._begin_prefills(plan.newcomers, plan.chunk_tokens)
        for ticket in whole:
            self._wire(ticket, 0)
        if not self.tickets and not self.prefilling:
            return
        batch = self.batch
        live = {id(t) for t in self.tickets}
        decoding = [t for t in plan.decodes if id(t) in live]  # less those cancelled since it was planned
        old_units = [u for t in decoding for u in t.units if u.finish_reason is None]
        state_layers, layers = self.lanes.capture_layers(
            [r.effective for j in self.prefilling for r in j.ticket.request.decoded]
        )
        with self._masking() as masker:
            if not batch.empty:
                with LayerCapture(self.anatomy, decode_layers) as decode_capture:
                    batch.forward(batch.layout.next_tokens(old_units), decode_capture, masker, plan.bucket)
            with LayerCapture(self.anatomy, layers) as capture:
                self._prefill(whole, plan, capture, masker)
        joined = whole + self._join_prefilled(layers)
        if joined:
            self.stats.admissions += 1
        if not self.tickets:
            return
        state_layers, _ = self.lanes.capture_layers()
        if self._lane_inputs is None or self._lane_inputs_version != batch.layout.version:
            self._lane_inputs, self._lane_inputs_version = (
                LaneInputs(list(self.lanes), batch.layout.num_rows, self._end_tokens),
                batch.layout.version,
            )
        host, lane_steps = decide(self.anatomy, batch, list(self.lanes), self._lane_inputs, state_layers)
        failed = advance(host, lane_steps, self._decode_token, eos_token_ids, dtype)
        self.stats.steps += 1
        self.stats.tokens += sum(len(s.units) for s in lane_steps) - len(failed)
        self.stats.largest_batch = max(self.stats.largest_batch, len(self.tickets))
        self.stats.peak_rows = max(self.stats.peak_rows, batch.layout.num_rows)
        self._settle(failed, release)
        self._compact()

    def _wire(self, ticket: Ticket, row_offset: int) -> None:
        """A ticket's units join their lanes and the decode (their rows, numbered from 0, moved by `row_offset`)."""
        for unit in ticket.units:
            unit.ticket = ticket
            unit.rows = {path: [r + row_offset for r in rows] for path, rows in unit.rows.items()}
            self.lanes.add(unit, ticket.request.decoded[unit.index].effective, ticket.request.settings, unit.head_set)
        self.tickets.append(ticket)

    def _begin_prefills(self, newcomers: Sequence[Ticket], chunk_tokens: int) -> None:
        """Newcomers start their chunked prefill, each with the job made at its admission (`reserve`) or a new one."""
        self.prefilling += [
            self._reserved.pop(id(t)) if id(t) in self._reserved else self._prefill_job(t, chunk_tokens)
            for t in newcomers
        ]

    def _prefill_job(self, ticket: Ticket, chunk_tokens: int) -> TicketPrefill:
        example = ticket.request.example
        units = [(u, example, u.head_set) for u in ticket.units]
        groups, _ = prefill_groups(units, 0)  # rows numbered from 0 until the request joins
        references = [*prefill_anchors(example), *example.template_prefixes]
        rows = row_prefills(groups, chunk_tokens, references, self.head_sets, self.prefixes.block_size)
        self.stats.prompt_tokens += sum(len(r.ids) for r in rows)
        return TicketPrefill(ticket, groups, rows)

    def _start_row(self, row: RowPrefill) -> None:
        row.start(self.anatomy, self.prefixes)

    def _prefill(
        self, whole: Sequence[Ticket], plan: ScheduledStep, capture: LayerCapture, masker: HeadMasker | None
    ) -> None:
        """Prefill this step's prompts: the newcomers prefilled whole join the batch now, then the plan's chunks."""
        if whole:
            units = [(u, t.request.example, u.head_set) for t in whole for u in t.units]
            groups, head_sets = prefill_groups(units, self.batch.layout.num_rows)
            self.batch.join(groups, head_sets, capture, masker)
        for chunk in plan.prefill_chunks(self.prefilling, self._start_row):
            self.stats.prefill_tokens += chunk.row.run_chunk(
                self.anatomy, self.input_device, capture, masker, self.prefixes
            )

    def _join_prefilled(self, layers: tuple[int, ...]) -> list[Ticket]:
        """Requests whose every row is prefilled join the decode (their rows after the current ones)."""
        done = [job for job in self.prefilling if job.finished]
        for job in done:
            offset = self.batch.layout.num_rows
            head_sets = [g.head_set for g in job.groups for _ in g.sequences]
            self.batch.append(
                job.prefilled(self.anatomy.config),
                job.states(layers),
                head_sets,
                [len(r.ids) for r in job.rows],
                self._prompt_blocks(job),
                job.pinned,
            )
            self._drop_hold(job)  # taken over by the rows
            self._wire(job.ticket, offset)  # after its rows joined: a request whose rows could not join is in no lane
        self.prefilling = [job for job in self.prefilling if not job.finished]
        return [job.ticket for job in done]

    def _prompt_blocks(self, job: TicketPrefill) -> list[PromptBlocks] | None:
        """The rows' prompt blocks, where the batch takes them by reference and the prefix cache's blocks are the
        pool's (hashing them is otherwise wasted). Hashed once per job: `reserve` at admission and the join share
        them (they depend on the rows' ids, cuts and head sets alone)."""
        if not (self.batch.shares_prompt_blocks and self.prefixes.enabled and self.prefixes.block_size == BLOCK):
            return None
        if job.prompt_blocks is None:
            job.prompt_blocks = [row.prompt_blocks(self.prefixes) for row in job.rows]
        return job.prompt_blocks

    def _masking(self) -> AbstractContextManager[HeadMasker | None]:
        """The head masker over every set of heads registered so far (rebuilt when a new set arrives)."""
        if not self.head_sets:
            return contextlib.nullcontext()
        if self._masker is None or self._masker_sets != len(self.head_sets):
            self._masker, self._masker_sets = HeadMasker(self.anatomy, list(self.head_sets)), len(self.head_sets)
        return self._masker

    def _settle(
        self, failed: list[tuple[Unit, BaseException]], release: Callable[[Sequence[Ticket], bool], list[Ticket]]
    ) -> None:
        """Fail the requests of failed units, stream new text, release the requests that finished as `release` says."""
        for unit, error in failed:
            ticket = unit.ticket
            if ticket in self.tickets and not ticket.handle.done():
                ticket.fail(error)
                self.stats.failed += 1
            for other in ticket.units:
                other.finish_reason = other.finish_reason or "cancelled"
        still: list[Ticket] = []
        finished: list[Ticket] = []
        for ticket in self.tickets:
            if ticket.handle.done() and not ticket.handle.cancelled:  # failed just now
                continue
            ticket.stream_delta()
            (finished if ticket.finished else still).append(ticket)
        self.tickets = still
        for ticket in release(finished, bool(still or self.prefilling)):
            self._release(ticket)

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
            self._release_pins(job)
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
        """A step failed outside any one rule (the forward itself): fail every request it held and `newcomers` (those
        admitted or held back at it), start clean."""
        held: dict[int, Ticket] = {}
        for ticket in [*self.tickets, *(job.ticket for job in self.prefilling), *newcomers]:
            held.setdefault(
                id(ticket), ticket
            )  # a request that joined at the failed step is both decoding and prefilling
        self.tickets, self.prefilling = [], []  # start clean before failing anyone: nothing of the failed step survives
        self._reserved, self._held_blocks = {}, {}  # the old pool and its pins go together
        self.batch = self._new_batch()
        self.lanes = Lanes(self.anatomy.num_layers)
        self._lane_inputs = None
        for ticket in held.values():
            if not ticket.handle.done():
                ticket.fail(error)
                self.stats.failed += 1
