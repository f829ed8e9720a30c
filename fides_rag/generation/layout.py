"""The row layout of a decode: which batch row is which path of which example under which method (lane),
and compaction when rows finish.

At prefill the rows come in groups, each only when some lane needs it (see `PATHS`): the context prompts
[ctx_1 .. ctx_B], the no-context prompts [noctx_1 .. noctx_B], one prompt per document [d_1,1 .. d_B,N_B],
and one copy of the context prompts per distinct set of masked heads. Lanes share these rows at prefill;
from the first step on each lane owns its rows (path by path, lane by lane, unit by unit), and the rows of
finished units leave the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from fides_rag.generation.prompting import PreparedExample
from fides_rag.generation.settings import RowSettings
from fides_rag.result import FinishReason, StepRecord
from fides_rag.rules.base import CONTEXT, DOCUMENTS, MASKED_HEADS, NO_CONTEXT, PATHS


@dataclass
class Unit:
    """Decoding state of one example under one method (a lane), and its rows in the current batch."""

    lane: int
    example: int
    stop: tuple[str, ...]
    rows: dict[str, list[int]]
    """path -> this unit's batch rows of it (only the paths its rule runs); one row per path but DOCUMENTS."""
    max_new_tokens: int = 128
    seed: int | None = None
    generator: torch.Generator | None = None
    generated: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    finish_reason: FinishReason | None = None


@dataclass(frozen=True)
class LaneNeeds:
    """What one lane's rule asks of the batch."""

    paths: tuple[str, ...]
    head_set: int = -1
    """Index of its distinct set of masked heads (MASKED_HEADS path), -1 for none."""


@dataclass
class GroupSpec:
    """One prefill row group: its path, its prompts, and the head set it runs with."""

    path: str
    sequences: list[list[int]]
    head_set: int = -1


class RowLayout:
    """Rows of every path of every unit; `compact` reorders them after each step."""

    def __init__(self, examples: Sequence[PreparedExample], lanes: Sequence[LaneNeeds], settings: Sequence[RowSettings]) -> None:
        wanted = {path for lane in lanes for path in lane.paths}
        self.groups: list[GroupSpec] = [GroupSpec(CONTEXT, [e.context_ids for e in examples])]
        start: dict[tuple[str, int], int] = {(CONTEXT, -1): 0}
        if NO_CONTEXT in wanted:
            start[(NO_CONTEXT, -1)] = self._add(GroupSpec(NO_CONTEXT, [e.no_context_ids for e in examples]))
        doc_first: list[int] = []  # example b's first document row, relative to the group
        if DOCUMENTS in wanted:
            flat: list[list[int]] = []
            for e in examples:
                doc_first.append(len(flat))
                flat.extend(e.document_ids or [])
            start[(DOCUMENTS, -1)] = self._add(GroupSpec(DOCUMENTS, flat))
        for head_set in sorted({lane.head_set for lane in lanes if lane.head_set >= 0}):
            start[(MASKED_HEADS, head_set)] = self._add(GroupSpec(MASKED_HEADS, [e.context_ids for e in examples], head_set))

        def first_rows(lane: LaneNeeds, b: int) -> dict[str, list[int]]:
            rows = {CONTEXT: [b]}
            for path in lane.paths:
                if path == DOCUMENTS:
                    first = start[(DOCUMENTS, -1)] + doc_first[b]
                    rows[DOCUMENTS] = list(range(first, first + len(examples[b].document_ids or [])))
                elif path == MASKED_HEADS:
                    if lane.head_set >= 0:
                        rows[MASKED_HEADS] = [start[(MASKED_HEADS, lane.head_set)] + b]
                elif path != CONTEXT:
                    rows[path] = [start[(path, -1)] + b]
            return rows

        self.units = [
            [
                Unit(i, b, examples[b].stop + row.stop, first_rows(lane, b), row.max_new_tokens, row.seed)
                for b, row in enumerate(settings)
            ]
            for i, lane in enumerate(lanes)
        ]
        self.row_head_sets = [g.head_set for g in self.groups for _ in g.sequences]
        """The head set of every current row (-1: none)."""
        self.num_rows = len(self.row_head_sets)
        self.version = 0
        """Bumped whenever rows move, so index tensors built from the layout can be cached until then."""

    def _add(self, group: GroupSpec) -> int:
        first = sum(len(g.sequences) for g in self.groups)
        self.groups.append(group)
        return first

    def active(self) -> list[list[Unit]]:
        """Per lane, the units still decoding."""
        return [[u for u in lane if u.finish_reason is None] for lane in self.units]

    def compact(self) -> list[int] | None:
        """Give every unfinished unit its own rows, path by path and lane by lane; drop finished ones.

        Returns the previous row of every new row (None when nothing moved, e.g. one lane, nobody finished)."""
        previous: list[int] = []
        active = self.active()
        for path in PATHS:  # path-major, so each path's rows stay one segment of the ragged cache
            for lane_units in active:
                for unit in lane_units:
                    rows = unit.rows.get(path)
                    if rows is None:
                        continue
                    unit.rows[path] = list(range(len(previous), len(previous) + len(rows)))
                    previous += rows
        if previous == list(range(self.num_rows)):
            return None
        self.row_head_sets = [self.row_head_sets[r] for r in previous]
        self.num_rows = len(previous)
        self.version += 1
        return previous

    def next_tokens(self) -> list[int]:
        """The last chosen token of every current row's unit, in row order."""
        tokens = [0] * self.num_rows
        for lane_units in self.active():
            for unit in lane_units:
                for rows in unit.rows.values():
                    for row in rows:
                        tokens[row] = unit.generated[-1]
        return tokens
