"""LangChain's tools, tool calls and structured output over the core's `fides_rag.calls`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import BaseMessage
from langchain_core.messages.tool import tool_call, tool_call_chunk
from langchain_core.output_parsers import (
    JsonOutputKeyToolsParser,
    JsonOutputParser,
    PydanticOutputParser,
    PydanticToolsParser,
)
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

from fides_rag.calls import IncompleteAnswerError, ToolCall, check_complete, constraint_of

STRUCTURED_METHODS = ("json_schema", "function_calling", "json_mode")


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Every tool LangChain's `convert_to_openai_tool` accepts (BaseTool, function, pydantic class, TypedDict, dict)."""
    return [t if isinstance(t, dict) and t.get("type") == "function" else convert_to_openai_tool(t) for t in tools]


def lc_tool_calls(calls: Sequence[ToolCall], chunks: bool = False) -> list[Any]:
    """The core's calls as `AIMessage.tool_calls`, or as one chunk's `tool_call_chunks`."""
    if chunks:
        return [
            tool_call_chunk(name=c.name, args=json.dumps(c.arguments), id=c.id, index=i) for i, c in enumerate(calls)
        ]
    return [tool_call(name=c.name, args=c.arguments, id=c.id) for c in calls]


def _complete(message: BaseMessage) -> BaseMessage:
    try:
        check_complete(message.text, message.response_metadata.get("finish_reason"))
    except IncompleteAnswerError as err:
        raise OutputParserException(str(err), llm_output=message.text) from None
    return message


def structured_output(
    bind: Callable[..., Runnable], bind_tools: Callable[..., Runnable], schema: Any, method: str, include_raw: bool
) -> Runnable:
    """BaseChatModel.with_structured_output's conventions over a grammar: json_schema binds the schema as the decoding
    constraint, function_calling forces a call of it as a tool; an answer cut at the token budget is a parsing error,
    never a partial object. The model is the chain's first step, so a call's options reach it (include_raw too)."""
    if method not in STRUCTURED_METHODS:
        raise ValueError(f"method must be one of {', '.join(STRUCTURED_METHODS)}, got {method!r}")
    if schema is None and method != "json_mode":
        raise ValueError(f"method={method!r} needs a schema (a pydantic class, a TypedDict or a JSON schema dict)")
    pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    if method == "function_calling":
        tool = convert_to_openai_tool(schema)
        name = tool["function"]["name"]
        llm = bind_tools(
            [schema], tool_choice=name, ls_structured_output_format={"kwargs": {"method": method}, "schema": tool}
        )
        parser: Runnable = (
            PydanticToolsParser(tools=[schema], first_tool_only=True)
            if pydantic
            else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        )
    else:  # json_mode: any object, or the schema when one is given; objects closed as in OpenAI's strict mode
        given = None if schema is None else convert_to_json_schema(schema)
        fmt = {"kwargs": {"method": method}, "schema": given}
        llm = bind(
            **constraint_of(json_schema={"type": "object"} if given is None else given), ls_structured_output_format=fmt
        )
        parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
    parser = RunnableLambda(_complete, name="complete_answer") | parser
    if not include_raw:
        return llm | parser

    def with_raw(message: BaseMessage) -> dict[str, Any]:
        try:
            return {"raw": message, "parsed": parser.invoke(message), "parsing_error": None}
        except Exception as err:  # reported beside the raw message, as langchain-core does
            return {"raw": message, "parsed": None, "parsing_error": err}

    return llm | RunnableLambda(with_raw, name="include_raw")
