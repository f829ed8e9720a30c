"""The path table: every path kind a rule can ask for (`ContrastRule.paths`), in the order their rows sit in the
running batch, with what decoding needs to know of it: the prompts that make its rows, which methods run it, and
how a rule reads it. The request builder, the row layout, the engine, the requests in flight, the step's gather
and the results read this table, so a new path kind is a name in `fides_rag.rules.base`, a row here, and the
rule that reads it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fides_rag.generation.prompting import PreparedExample
from fides_rag.rules.base import CONTEXT, DOCUMENTS, MASKED_HEADS, NO_CONTEXT, ContrastRule

Heads = dict[int, tuple[int, ...]]


@dataclass(frozen=True)
class PathKind:
    """One kind of path: its name, its prompts, when it runs and how a rule reads it."""

    name: str
    prompts: Callable[[PreparedExample], list[list[int]]]
    """The prompt ids of its rows for one example, one row per prompt."""
    prompt_text: Callable[[PreparedExample], str | None] = lambda example: None
    """The prompt a result reports for it (`GenerationResult.no_context_prompt`, say); None: none."""
    always: bool = False
    """Run for every method, whatever its `paths` (the context path, whose logits every rule reads)."""
    per_head_set: bool = False
    """Runs with attention heads masked: only for a method whose setup hook names heads, one copy of its rows
    per distinct set of heads."""
    padded: bool = False
    """Several rows per example, read as [B, N, V] logits padded over examples with `StepInputs.document_mask`;
    otherwise one row per example, read as [B, V]."""
    anchors_prefill: bool = False
    """Its prompts are where other prompts of the example are cut for the prefill and the prefix cache (what
    they share with it)."""


PATH_KINDS: dict[str, PathKind] = {
    kind.name: kind
    for kind in (
        PathKind(CONTEXT, lambda e: [e.context_ids], always=True, anchors_prefill=True),
        PathKind(NO_CONTEXT, lambda e: [e.no_context_ids], lambda e: e.no_context_prompt, anchors_prefill=True),
        PathKind(DOCUMENTS, lambda e: list(e.document_ids or []), padded=True),
        PathKind(MASKED_HEADS, lambda e: [e.context_ids], per_head_set=True),
    )
}
"""name -> its kind, in row order (`fides_rag.rules.base.PATHS` first)."""


def path_kind(name: str, rule: ContrastRule | None = None) -> PathKind:
    """The kind named `name`; a clear error for a name the table lacks (a rule asking for an unknown path)."""
    kind = PATH_KINDS.get(name)
    if kind is None:
        asker = f"method {rule.name!r} reads" if rule is not None else "no path kind is named"
        raise ValueError(
            f"{asker} path {name!r}, which the decoder cannot run; paths are {', '.join(map(repr, PATH_KINDS))}"
        )
    return kind


def paths_run(rule: ContrastRule, heads: Heads | None) -> list[PathKind]:
    """The kinds a method runs, in row order: those it reads (per-head-set ones only when it masks some heads),
    and the ones every method runs."""
    for name in rule.paths:
        path_kind(name, rule)
    return [
        kind
        for kind in PATH_KINDS.values()
        if kind.always or (kind.name in rule.paths and (bool(heads) or not kind.per_head_set))
    ]


def masks_heads(rule: ContrastRule) -> bool:
    """Whether a rule reads a path run with masked heads (its setup hook then names them)."""
    return any(path_kind(name, rule).per_head_set for name in rule.paths)


def prompt_ids(rule: ContrastRule, example: PreparedExample, heads: Heads | None) -> list[list[int]]:
    """The prompt of every row a method holds for `example`, in row order."""
    return [ids for kind in paths_run(rule, heads) for ids in kind.prompts(example)]


def longest_prompt(example: PreparedExample) -> int:
    """The longest prompt any path of `example` may run (what must fit in the model's context window)."""
    return max(len(ids) for kind in PATH_KINDS.values() for ids in kind.prompts(example))


def prefill_anchors(example: PreparedExample) -> list[list[int]]:
    """The prompts of `example` where other prompts are cut for the prefill (properties of the example, whatever
    methods decode it)."""
    return [ids for kind in PATH_KINDS.values() if kind.anchors_prefill for ids in kind.prompts(example)]


def reported_prompt(name: str, rule: ContrastRule, example: PreparedExample) -> str | None:
    """The prompt a result of `rule` reports for path `name`: its text where the rule reads the path, else None."""
    return path_kind(name).prompt_text(example) if name in rule.paths else None
