"""Structured output: what a call's answer is held to (a JSON schema, a pydantic class, a regex, a grammar), checked
before anything decodes, and the answer read back as that structure, for every front door.

Bad input is a `CallInputError` (a ValueError) naming the field: a schema the grammar library cannot compile, or one
with a keyword it does not implement (refused, never ignored, strict or not).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from fides_rag.calls.options import CONSTRAINTS
from fides_rag.errors import CallInputError, IncompleteAnswerError
from fides_rag.generation.grammar.constraint import GrammarConstraint
from fides_rag.generation.grammar.schema_support import check_schema_shape
from fides_rag.generation.requests import special_token_id

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@overload
def closed_schema(schema: dict[str, Any]) -> dict[str, Any]: ...
@overload
def closed_schema(schema: object) -> object: ...
def closed_schema(schema: object) -> object:
    """`schema` with every object that lists its properties closed to others (`additionalProperties: false` where
    the schema does not say), as OpenAI's strict mode does: a grammar then cannot add keys the caller did not ask
    for."""
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(closed.get(key), dict):
            closed[key] = {name: closed_schema(sub) for name, sub in closed[key].items()}
    for key in ("items", "additionalProperties", "not", "contains"):
        if isinstance(closed.get(key), dict):
            closed[key] = closed_schema(closed[key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(closed.get(key), list):
            closed[key] = [closed_schema(sub) for sub in closed[key]]
    if (closed.get("type") == "object" or "properties" in closed) and "additionalProperties" not in closed:
        closed.setdefault("properties", {})
        closed["additionalProperties"] = False
    return closed


def schema_of(spec: object, field: str = "json_schema") -> dict[str, Any]:
    """A JSON schema from a dict, JSON text or a pydantic model class."""
    if isinstance(spec, type) and hasattr(spec, "model_json_schema"):
        return spec.model_json_schema()
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as err:
            raise CallInputError(f"{field} is not valid JSON: {err}", field) from None
    if not isinstance(spec, Mapping):
        raise CallInputError(
            f"{field} must be a JSON schema (a dict) or a pydantic model class, got {type(spec).__name__}", field
        )
    return dict(spec)


def check_json_schema(schema: Mapping[str, Any], field: str, *, what: str | None = None) -> None:
    """A CallInputError naming `field` when `schema` would admit no value (a cycle of references with no content, a
    schema requiring itself without end) or passes the grammar's limits (`schema_support.check_schema_shape`), or when
    the grammar library cannot compile it (an invalid schema, or a keyword it does not implement). The library's own
    check is skipped where the `grammar` extra (llguidance) is not installed: the decoder then refuses every
    constrained call with the install command."""
    try:
        check_schema_shape(schema)
    except ValueError as err:
        raise CallInputError(f"{what or field}: {err}", field) from None
    try:
        import llguidance
    except ImportError:
        return
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        problem = llguidance.LLMatcher.validate_grammar(grammar)
    except (ValueError, TypeError) as err:
        problem = str(err)
    if problem:
        raise CallInputError(f"{what or field}: the schema cannot be compiled to a grammar: {problem.strip()}", field)


def constraint_of(
    *,
    json_schema: object = None,
    regex: str | None = None,
    grammar: str | None = None,
    strict: bool = True,
    field: str = "json_schema",
) -> dict[str, Any]:
    """The decoder's keyword for at most one of `json_schema` (closed as OpenAI's strict mode closes objects unless
    `strict=False`), `regex` or `grammar`, checked before anything decodes; {} when none is given."""
    given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar)) if v is not None}
    if len(given) > 1:
        raise CallInputError(
            f"give at most one of json_schema=, regex= and grammar=, got {', '.join(given)}", next(iter(given))
        )
    if "json_schema" in given:
        schema = schema_of(json_schema, field)
        schema = closed_schema(schema) if strict else schema
        check_json_schema(schema, field)
        return {"json_schema": schema}
    return given


def with_structure(call: Mapping[str, Any], spec: object, what: str = "a structured answer") -> dict[str, Any]:
    """`call` (one call's keywords) decoded under `spec`'s JSON schema (a pydantic class or a schema; objects closed,
    checked before anything decodes). A grammar the call gives as well is refused: `what` is held to the schema."""
    refuse_other_grammar(call, f"{what} holds the answer to its JSON schema")
    return {**call, **constraint_of(json_schema=spec)}


def refuse_other_grammar(call: Mapping[str, Any], why: str) -> None:
    """A CallInputError naming the grammar keywords (json_schema=, regex=, grammar=) that `call` (one call's keywords
    or its options' constraint) gives, where the answer is already held to a grammar of its own: `why` says which
    ("...; drop regex=")."""
    given = [k for k in CONSTRAINTS if call.get(k) is not None]
    if given:
        raise CallInputError(f"{why}; drop {', '.join(given)}=", given[0])


def refuse_cutting_stops(stop: Sequence[str], tokenizer: PreTrainedTokenizerBase | None, what: str) -> None:
    """A CallInputError naming `stop` where `what` (a structured answer, a forced call) is asked with a stop string
    that could cut it: its grammar decides where it ends, and a stop string matched in its text ("a" inside a key)
    would end it mid-structure. A stop that is one special token (an end-of-turn token) is taken: it ends the grammar
    as EOS does, where the answer is complete."""
    if tokenizer is None:
        return
    cutting = [s for s in stop if special_token_id(tokenizer, s) is None]
    if cutting:
        raise CallInputError(
            f"stop strings cannot end {what}: its grammar decides where it ends, and {cutting[0]!r} could match "
            "inside it and cut it mid-structure; drop stop (one special token, such as an end-of-turn token, is "
            "accepted: it ends the answer where it is complete)",
            "stop",
        )


def shortest_answer_tokens(
    tokenizer: PreTrainedTokenizerBase,
    *,
    json_schema: Mapping[str, Any] | str | type | None = None,
    regex: str | None = None,
    grammar: str | None = None,
    limit: int = 200,
) -> int:
    """Tokens of the shortest complete answer the constraint allows (searched up to `limit` tokens): the least
    max_new_tokens a structured call or a forced tool call can be given. None found within `limit`: ValueError."""
    constraint = GrammarConstraint.compile(tokenizer, json_schema=json_schema, regex=regex, grammar=grammar)
    shortest = constraint.start().completion(limit)
    if shortest is None:
        raise ValueError(f"no complete answer of at most limit={limit} tokens; raise limit")
    return len(shortest)


def check_complete(text: str, finish_reason: str | None) -> str:
    """`text`, if the model finished it: a structured answer cut at the token budget raises instead of parsing as a
    partial object."""
    if finish_reason == "length":
        raise IncompleteAnswerError(
            f"the structured answer was cut at max_new_tokens before it was complete ({text!r}); raise max_new_tokens"
        )
    return text


def parse_structure(text: str, finish_reason: str | None, schema: object = None) -> Any:
    """The answer as `schema`'s object (a pydantic class validates it), or as JSON; cut answers raise."""
    check_complete(text, finish_reason)
    if isinstance(schema, type) and hasattr(schema, "model_validate_json"):
        return schema.model_validate_json(text)
    return json.loads(text)
