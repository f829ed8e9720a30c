"""Result assembly: a finished unit (its ids, per-token records and finish reason) becomes a `GenerationResult`."""

from __future__ import annotations

from collections.abc import Callable

from fides_rag.generation.engine.layout import Unit
from fides_rag.generation.paths import reported_prompt
from fides_rag.generation.prompting import PreparedExample
from fides_rag.generation.stopping import first_stop_index
from fides_rag.prompts.answer_text import AnswerText
from fides_rag.result import GenerationResult
from fides_rag.rules.base import NO_CONTEXT, ContrastRule


def assemble(
    example: PreparedExample,
    unit: Unit,
    effective: ContrastRule,
    requested: ContrastRule,
    stops: tuple[str, ...],
    decode: Callable[[list[int]], str],
    answer_text: AnswerText | None = None,
) -> GenerationResult:
    """The result of `unit`: its text cut at the first stop string and by `answer_text` (template leftovers, markup,
    role lines; each cut noted), its records, and how it came to be."""
    text = decode(unit.generated)
    cut = first_stop_index(text, stops)
    if cut is not None:
        text = text[:cut]
    notes = list(example.notes)
    if answer_text is not None:
        text, cuts = answer_text.clean(text, truncated=unit.finish_reason in (None, "length"))
        notes += cuts
    short = unit.grammar.budget_short if unit.grammar is not None else None
    if short is not None:
        notes.append(
            f"max_new_tokens={unit.max_new_tokens} is fewer than the {short} tokens the shortest answer of the "
            f"grammar needs, so the structured answer is cut: raise max_new_tokens"
        )
    return GenerationResult(
        text=text.strip(),
        token_ids=list(unit.generated),
        steps=list(unit.steps),
        method=effective.name,
        requested_method=requested.name,
        method_options=effective.options(),
        finish_reason=unit.finish_reason or "length",
        context_prompt=example.context_prompt,
        no_context_prompt=reported_prompt(NO_CONTEXT, effective, example),
        prompt_tokens=len(example.context_ids),
        notes=notes,
        documents_trimmed=example.documents_trimmed,
        document_tokens=example.document_tokens,
        closed_early=unit.grammar is not None and unit.grammar.closed_early,
    )
