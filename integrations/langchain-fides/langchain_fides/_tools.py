"""LangChain's tools, tool choices, tool calls and structured output, adapted to the core's `fides_rag.tool_calls`."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.messages.tool import ToolCall as LCToolCall
from langchain_core.messages.tool import tool_call, tool_call_chunk
from langchain_core.output_parsers import JsonOutputKeyToolsParser, JsonOutputParser, PydanticOutputParser, PydanticToolsParser
from langchain_core.exceptions import OutputParserException
from langchain_core.runnables import Runnable, RunnableLambda, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

from fides_rag.tool_calls import CHOICES, ToolCall, ToolCalling, ToolSpec, closed_schema

STRUCTURED_METHODS = ("json_schema", "function_calling", "json_mode")


def openai_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """Every tool LangChain's `convert_to_openai_tool` accepts (BaseTool, function, pydantic class, TypedDict, dict)
    in OpenAI's shape."""
    return [convert_to_openai_tool(t) for t in tools]


def tool_choice_name(tool_choice: Any, tools: Sequence[dict[str, Any]]) -> str | None:
    """LangChain's tool_choice forms (None, "auto", "none", "any", "required", a name, True, {"type": "function",
    "function": {"name": ...}}) as the core's string."""
    if tool_choice is None or tool_choice is False:
        return "auto" if tool_choice is None else "none"
    if tool_choice is True:
        if len(tools) != 1:
            raise ValueError(f"tool_choice=True forces the only tool, but {len(tools)} tools were given; name one")
        return tools[0]["function"]["name"]
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        if tool_choice.get("type") in ("any", "required", "auto", "none") and not name:
            return tool_choice["type"]
        if not isinstance(name, str):
            raise ValueError(f"tool_choice dict must name a function ({{'type': 'function', 'function': {{'name': ...}}}}), got {tool_choice!r}")
        return name
    if isinstance(tool_choice, str):
        return tool_choice
    raise TypeError(f"tool_choice must be a string, a bool or a dict, got {type(tool_choice).__name__}")


def check_tool_choice(tool_choice: Any, tools: Sequence[dict[str, Any]]) -> None:
    """A ValueError when `tool_choice` names no bound tool (or forces a call without tools)."""
    choice = tool_choice_name(tool_choice, tools)
    names = [t["function"]["name"] for t in tools]
    if choice not in (*CHOICES, *names):
        raise ValueError(f"tool_choice must be one of {', '.join(CHOICES)} or a bound tool's name ({', '.join(names) or 'no tools'}), got {tool_choice!r}")
    if choice in ("any", "required") and not tools:
        raise ValueError(f"tool_choice={tool_choice!r} needs at least one tool")


def tool_calling(tokenizer: Any, kwargs: dict[str, Any]) -> ToolCalling | None:
    """The call's ToolCalling from its bound `tools` and `tool_choice` (None when no tools are bound)."""
    tools = kwargs.get("tools")
    if not tools:
        if kwargs.get("tool_choice") not in (None, "auto", "none"):
            raise ValueError(f"tool_choice={kwargs['tool_choice']!r} needs tools: use bind_tools(tools, tool_choice=...)")
        return None
    specs = [ToolSpec.from_openai(t if isinstance(t, dict) and t.get("type") == "function" else convert_to_openai_tool(t)) for t in tools]
    return ToolCalling(tokenizer, specs, tool_choice_name(kwargs.get("tool_choice"), [s.openai() for s in specs]))


def message_text(message: BaseMessage, calling: ToolCalling) -> str:
    """A message's text for the prompt: an AI message's earlier tool calls are written after its content."""
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = [ToolCall(c["name"], dict(c.get("args") or {}), c.get("id") or "") for c in message.tool_calls]
        return calling.render_calls(message.text, calls)
    return message.text


def lc_tool_calls(calls: Sequence[ToolCall]) -> list[LCToolCall]:
    """The core's calls as LangChain's `AIMessage.tool_calls`."""
    return [tool_call(name=c.name, args=c.arguments, id=c.id) for c in calls]


def lc_tool_call_chunks(calls: Sequence[ToolCall]) -> list[Any]:
    """The core's calls as one chunk's `tool_call_chunks` (complete arguments, one index each)."""
    return [tool_call_chunk(name=c.name, args=json.dumps(c.arguments), id=c.id, index=i) for i, c in enumerate(calls)]


def complete_answer(message: BaseMessage) -> BaseMessage:
    """The message, if the model finished it: an answer cut at the token budget raises instead of parsing as a
    partial object (LangChain's JSON parsers would accept a prefix) or as no call."""
    if message.response_metadata.get("finish_reason") == "length":
        raise OutputParserException(
            f"the structured answer was cut at max_new_tokens before it was complete ({message.text!r}); raise max_new_tokens",
            llm_output=message.text,
        )
    return message


def structured_output(
    bind: Callable[..., Runnable], bind_tools: Callable[..., Runnable], schema: Any, method: str, include_raw: bool
) -> Runnable:
    """BaseChatModel.with_structured_output's conventions over a grammar: json_schema binds the schema as the
    decoding constraint, function_calling forces a call of the schema as a tool; parsers and include_raw as in
    langchain-core, except that an answer cut at the token budget is a parsing error, never a partial object."""
    if method not in STRUCTURED_METHODS:
        raise ValueError(f"method must be one of {', '.join(STRUCTURED_METHODS)}, got {method!r}")
    if schema is None and method != "json_mode":
        raise ValueError(f"method={method!r} needs a schema (a pydantic class, a TypedDict or a JSON schema dict)")
    pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    if method == "function_calling":
        tool = convert_to_openai_tool(schema)
        name = tool["function"]["name"]
        llm = bind_tools([schema], tool_choice=name, ls_structured_output_format={"kwargs": {"method": method}, "schema": tool})
        parser: Runnable = PydanticToolsParser(tools=[schema], first_tool_only=True) if pydantic else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
    else:
        # json_mode: any object, or the schema when one is given; objects are closed as in OpenAI's strict mode.
        given = None if schema is None else convert_to_json_schema(schema)
        fmt = {"kwargs": {"method": method}, "schema": given}
        llm = bind(json_schema={"type": "object"} if given is None else closed_schema(given), ls_structured_output_format=fmt)
        parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
    parser = RunnableLambda(complete_answer, name="complete_answer") | parser
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    failed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")
