"""A chat body's agent fields as the call layer's inputs: `tools` and `tool_choice` as a `ToolCalling` (the core's
tool calling: prompt format, forced-call grammar, parsing), `response_format` as a grammar constraint,
`parallel_tool_calls: false` as a stop after the first call, `logprobs` as the count of alternatives. Each refusal is
a 400 naming the field that has to change."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fides_rag.calls import (
    CallFactory,
    CallInputError,
    ToolCalling,
    ToolSpec,
    check_strict_schema,
    constraint_of,
    unenforced_keywords,
)
from fides_rag.serve.errors import APIError, bad_request
from fides_rag.serve.protocol import ChatCompletionRequest, GenerationRequest

ANY_OBJECT = {"type": "object"}
CALL_END = "</tool_call>"


@dataclass
class AgentCall:
    """What a request's agent fields ask of its call."""

    calling: ToolCalling | None = None
    constraint: dict[str, Any] = field(default_factory=dict)
    """The response format's grammar ({"json_schema": ...}), or {}."""
    logprobs: int | None = None
    stop: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _named(err: CallInputError, param: str) -> APIError:
    return bad_request(" ".join(str(err).split()), param, "invalid_value")


def _strict(schema: Mapping[str, object], param: str) -> None:
    try:
        check_strict_schema(schema)
    except ValueError as err:
        raise bad_request(f"{param}: {err}", param, "unsupported_schema_keyword") from None


def _tools(body: ChatCompletionRequest) -> list[ToolSpec]:
    """The tools as the call layer's specs; a bad one is refused naming its field (`tools.0.function.name`), and so is
    a name given twice, as OpenAI's API refuses it (the call layer merges a tool given twice, identical)."""
    specs: list[ToolSpec] = []
    first: dict[str, int] = {}
    for i, tool in enumerate(body.tools or []):
        name = tool.function.name
        if name in first:
            raise bad_request(
                f"tools.{i}.function.name: the name {name!r} is taken by tools.{first[name]}; tool names must be "
                "unique "
                "within a request",
                f"tools.{i}.function.name",
                "invalid_value",
            )
        first[name] = i
        if tool.function.strict:
            _strict(tool.function.parameters or ANY_OBJECT, f"tools.{i}.function.parameters")
        try:
            specs.append(ToolSpec.from_openai(tool.model_dump(exclude_none=True)))
        except CallInputError as err:
            raise _named(err, err.field.replace("tools.", f"tools.{i}.", 1)) from None
    return specs


def _response_format(body: ChatCompletionRequest, call: AgentCall) -> None:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return
    if call.calling is not None and call.calling.tool_choice == "auto":
        raise bad_request(
            "response_format with tools under tool_choice auto is not supported: the answer would be held to "
            "the format and could never be a call; send tool_choice none, required or a function's name",
            "response_format",
            "conflicting_constraints",
        )
    if fmt.type == "json_object":
        call.constraint = {"json_schema": ANY_OBJECT}
        return
    if fmt.json_schema is None:
        raise bad_request(
            "response_format of type json_schema needs json_schema: {name, schema, strict}",
            "response_format.json_schema",
        )
    param = "response_format.json_schema.schema"
    schema = fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else ANY_OBJECT
    if fmt.json_schema.strict:
        _strict(schema, param)
    else:
        unenforced = unenforced_keywords(schema)
        if unenforced:
            call.notes.append(
                f"response_format's schema keywords {', '.join(unenforced)} are not enforced by the grammar "
                f"(set strict to true to have such a schema refused)"
            )
    try:
        call.constraint = constraint_of(json_schema=schema, strict=bool(fmt.json_schema.strict), field=param)
    except CallInputError as err:
        raise _named(err, param) from None


def agent_call(calls: CallFactory, body: GenerationRequest) -> AgentCall:
    """The agent fields of `body` (a completions body has logprobs only)."""
    call = AgentCall(logprobs=body.top_logprob_count())
    if not isinstance(body, ChatCompletionRequest):
        return call
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    choice = (
        body.tool_choice
        if body.tool_choice is None or isinstance(body.tool_choice, str)
        else body.tool_choice.model_dump()
    )
    try:
        call.calling = calls.tools(_tools(body), choice)
    except CallInputError as err:
        raise _named(err, err.field) from None
    if call.calling is not None and body.parallel_tool_calls is False and call.calling.tool_choice == "auto":
        call.stop.append(
            CALL_END
        )  # one call at most: the answer ends after its first call (a forced call's grammar admits one)
    _response_format(body, call)
    return call
