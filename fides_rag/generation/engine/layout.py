"""The row layout of the running decode: which batch row is which path of which unit (one request under one
method), rows appended when requests join, and compaction when units finish.

Rows join in groups, one per path of the newcomers that some method needs, in the path table's order
(`paths.PATH_KINDS`): their context prompts, their no-context prompts, one prompt per document, and one copy of
the context prompts per distinct set of masked heads. A request's methods share these rows at prefill; from its first
step on each unit owns
its rows (copies where several shared one), and a finished unit's rows leave the batch. Rows keep their order,
so each prefill group stays one run of rows (one segment of the ragged cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fides_rag.generation.detokenize import IncrementalText
from fides_rag.generation.paths import PATH_KINDS
from fides_rag.result import FinishReason, StepRecord


@dataclass(eq=False)
class Unit:
    """Decoding state of one request under one of its methods, and its rows in the current batch."""

    ticket: Any
    """The engine's record of the request this unit decodes (its handle, result slots and stream)."""
    index: int
    """Which distinct method of the request (`Request.decoded[index]`)."""
    rows: dict[str, list[int]]
    """path -> this unit's batch rows of it (only the paths its rule runs); one row per path but DOCUMENTS."""
    prompt_ids: list[int]
    """The context path's prompt ids: what logits processors and stopping criteria see before the answer."""
    stop: tuple[str, ...]
    max_new_tokens: int
    text: IncrementalText
    seed: int | None = None
    head_set: int = -1
    """The engine's index of this unit's set of masked heads (MASKED_HEADS path), -1 for none."""
    generator: torch.Generator | None = None
    processors: Any = None
    """This unit's own logits processors (the user's), built at admission; None when none."""
    min_new_tokens: int = 0
    """Tokens before which EOS is held back (the engine does it for all units at once, before their processors)."""
    eos_ids: tuple[int, ...] = ()
    """The ids min_new_tokens holds back."""
    criteria: Any = None
    """This unit's stopping criteria (transformers' StoppingCriteriaList), or None."""
    grammar: Any = None
    """This unit's `GrammarState` (its answer held to a JSON schema, regex or grammar), or None."""
    logprobs: int | None = None
    """Alternatives per token of the log-probabilities this unit records (None: it records none)."""
    rule_state: torch.Tensor | None = None
    """[state_size] what this unit's rule kept from its previous step, on the device (rules with `state_size` > 0)."""
    generated: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    stop_scanned: int = 0
    """Characters of `text` already searched for stop strings (less the longest stop's length)."""
    finish_reason: FinishReason | None = None
    error: BaseException | None = None


@dataclass
class GroupSpec:
    """One prefill row group: its path, its prompts, and the head set it runs with."""

    path: str
    sequences: list[list[int]]
    head_set: int = -1


def prefill_groups(newcomers: Sequence[tuple[Unit, Any, int]], first_row: int) -> tuple[list[GroupSpec], list[int]]:
    """Row groups for newcomer units [(unit, its PreparedExample, its head set or -1)], numbered from `first_row`.

    A unit's `rows` come in naming the paths it runs; they are filled in here. Units of one request share its
    prompt rows (one context row, one no-context row, ...). Returns the groups (path-major) and the head set of
    every new row."""
    examples: list[Any] = []  # distinct examples, in order of arrival
    for _, example, _ in newcomers:
        if not any(e is example for e in examples):
            examples.append(example)
    groups: list[GroupSpec] = []
    first: dict[tuple[str, int, int], int] = {}  # (path, head set, example id) -> its first row
    head_sets = sorted({h for *_, h in newcomers if h >= 0})
    keys = [(kind, h) for kind in PATH_KINDS.values() for h in (head_sets if kind.per_head_set else [-1])]
    at = first_row
    for kind, head_set in keys:
        users = {
            id(example)
            for unit, example, h in newcomers
            if kind.name in unit.rows and (not kind.per_head_set or h == head_set)
        }
        chosen = [e for e in examples if id(e) in users or kind.always]
        if not chosen:
            continue
        sequences: list[list[int]] = []
        for e in chosen:
            first[(kind.name, head_set, id(e))] = at + len(sequences)
            sequences.extend(kind.prompts(e))
        groups.append(GroupSpec(kind.name, sequences, head_set))
        at += len(sequences)
    for unit, example, head_set in newcomers:
        for path in unit.rows:
            kind = PATH_KINDS[path]
            row = first[(path, head_set if kind.per_head_set else -1, id(example))]
            unit.rows[path] = list(range(row, row + len(kind.prompts(example))))
    return groups, [g.head_set for g in groups for _ in g.sequences]


class RowLayout:
    """Rows of every path of every unit in flight; `append` adds newcomers' rows, `compact` reorders after a step."""

    def __init__(self) -> None:
        self.row_head_sets: list[int] = []
        """The head set of every current row (-1: none)."""
        self.lengths: list[int] = []
        """Every row's real length (prompt plus generated tokens in the cache), known on the host."""
        self.version = 0
        """Bumped whenever rows move, so index tensors built from the layout can be cached until then."""

    @property
    def num_rows(self) -> int:
        return len(self.row_head_sets)

    def append(self, head_sets: Sequence[int], lengths: Sequence[int]) -> None:
        """Rows of newcomers, after the current ones."""
        self.row_head_sets += list(head_sets)
        self.lengths += list(lengths)
        self.version += 1

    def grow(self) -> None:
        """Every row's cache took one more position (a decode forward)."""
        self.lengths = [n + 1 for n in self.lengths]

    def compact(self, units: Sequence[Unit]) -> list[int] | None:
        """Give each unit in `units` (those still decoding) its own rows, in row order; drop every other row.

        Returns the previous row of every new row (None when nothing moved)."""
        claims: dict[int, list[tuple[Unit, str, int]]] = {}
        for unit in units:
            for path, rows in unit.rows.items():
                for k, row in enumerate(rows):
                    claims.setdefault(row, []).append((unit, path, k))
        keep: list[int] = []
        for old in sorted(claims):
            for unit, path, k in claims[old]:
                unit.rows[path][k] = len(keep)
                keep.append(old)
        if keep == list(range(self.num_rows)):
            return None
        self.row_head_sets = [self.row_head_sets[r] for r in keep]
        self.lengths = [self.lengths[r] for r in keep]
        self.version += 1
        return keep

    def next_tokens(self, units: Sequence[Unit]) -> list[int]:
        """The last chosen token of every current row's unit, in row order."""
        tokens = [0] * self.num_rows
        for unit in units:
            for rows in unit.rows.values():
                for row in rows:
                    tokens[row] = unit.generated[-1]
        return tokens
