"""ToolCallFirst: a forced tool call, then the answer on the tool's result, under agent.invoke and agent.ainvoke."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import wrap_model_call
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from langchain_fides import ChatFides
from langchain_fides.middleware import ToolCallFirst

DOC = "The Eiffel Tower is in Rome."


@tool
def search(query: Literal["eiffel tower", "rome"]) -> str:
    """Search the documents."""
    return DOC


def _check(state: dict) -> None:
    messages = state["messages"]
    assert [c["name"] for c in messages[1].tool_calls] == ["search"]
    assert isinstance(messages[2], ToolMessage) and messages[2].content == DOC
    final = messages[-1]
    assert (
        isinstance(final, AIMessage)
        and not final.tool_calls
        and final.response_metadata["documents_source"] == "tool_messages"
    )


def test_tool_call_first_runs_under_invoke_and_ainvoke(decoder):
    agent = create_agent(ChatFides(decoder=decoder, max_new_tokens=120), [search], middleware=[ToolCallFirst()])
    question = {"messages": [("user", "Where is the Eiffel Tower?")]}
    _check(agent.invoke(question, {"recursion_limit": 6}))
    _check(asyncio.run(agent.ainvoke(question, {"recursion_limit": 6})))


def test_a_plain_function_middleware_has_no_async_hook(decoder):
    """Why the package ships ToolCallFirst: the same logic with @wrap_model_call fails under ainvoke."""

    @wrap_model_call
    def search_then_answer(request, handler):
        searched = any(isinstance(m, ToolMessage) for m in request.messages)
        return handler(request.override(tool_choice="none" if searched else "any"))

    agent = create_agent(ChatFides(decoder=decoder, max_new_tokens=120), [search], middleware=[search_then_answer])
    with pytest.raises(NotImplementedError, match="awrap_model_call"):
        asyncio.run(agent.ainvoke({"messages": [("user", "Where?")]}, {"recursion_limit": 6}))
