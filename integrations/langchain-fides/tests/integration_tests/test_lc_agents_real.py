"""LangChain v1's create_agent on the real backbone (smollm2-135m-instruct) with a retriever tool over a real FAISS
index: the tool's result is the evidence FIDES contrasts on the final turn; plus the forced call and structured output
on the real tokenizer's fallback tool format."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, wrap_model_call
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import create_retriever_tool
from pydantic import BaseModel, Field

from langchain_fides import ChatFides

from .test_lc_fides_real import DOCS, real_llm, retriever  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[4]


@wrap_model_call
def retrieve_first(request: ModelRequest, handler: Any) -> Any:
    """Search first, then answer: a forced call until a tool has answered, then no more calls (a 135M model neither
    chooses to call a tool by itself nor stops calling reliably)."""
    answered = any(isinstance(m, ToolMessage) for m in request.messages)
    return handler(request.override(tool_choice="none" if answered else "any"))


@pytest.fixture(scope="module")
def chat() -> ChatFides:
    return ChatFides(decoder=real_llm().decoder, model_id="smollm2-135m-instruct", max_new_tokens=40)


class Query(BaseModel):
    query: str = Field(max_length=24)
    """A short query: the grammar stops a small model from writing a paragraph into it."""


@pytest.fixture(scope="module")
def search(retriever: Any) -> Any:  # noqa: F811 - the imported fixture
    tool = create_retriever_tool(retriever, "search_documents", "Search the documents for facts about landmarks.")
    return tool.model_copy(update={"args_schema": Query})


def test_create_agent_runs_fides_on_the_tool_messages(chat, search):
    agent = create_agent(chat, [search], middleware=[retrieve_first])
    state = agent.invoke({"messages": [("user", "Where is the Eiffel Tower?")]}, {"recursion_limit": 6})
    messages = state["messages"]
    call, result, final = messages[1], messages[2], messages[-1]
    assert "Eiffel" in call.tool_calls[0]["args"]["query"], call.tool_calls  # the forced call's query is the question's
    assert (
        call.tool_calls[0]["name"] == "search_documents"
        and isinstance(result, ToolMessage)
        and DOCS[0] in result.content
    )
    meta = final.response_metadata
    print(f"[agent] query={call.tool_calls[0]['args']} answer={final.content!r} method={meta['method']}")
    assert isinstance(final, AIMessage) and not final.tool_calls and final.content.strip()
    assert meta["documents_source"] == "tool_messages" and meta["method"] == "fides" and meta["num_documents"] == 1
    assert DOCS[0] in meta["context_prompt"] and DOCS[0] not in meta["no_context_prompt"]
    assert meta["tool_format"] == "fallback" and meta["tool_choice"] == "none"  # retrieve_first: answer, no more calls
    assert f"<tool_response>\n{DOCS[0]}\n</tool_response>" in meta["context_prompt"]
    assert (
        "<tool_response>\n\n</tool_response>" in meta["no_context_prompt"]
    )  # the same conversation, the result emptied


class Place(BaseModel):
    """Where a landmark is."""

    city: str
    country: str


def test_structured_output_on_the_tool_evidence(chat):
    question = [
        ("system", f"Context: {DOCS[0]}"),
        ("human", "Where is the Eiffel Tower? Give the city and the country."),
    ]
    raw = chat.with_structured_output(Place, include_raw=True).invoke(question)
    meta = raw["raw"].response_metadata
    print(f"[structured] {raw['parsed']!r} method={meta['method']}")
    assert isinstance(raw["parsed"], Place) and raw["parsing_error"] is None
    assert meta["method"] == "fides" and meta["documents_source"] == "system_message"


def test_readme_agent_quick_start_runs_as_written():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples/quickstart_agent.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[0] == "Place(city='Rome', country='Italy')", lines  # what its comments say
    assert "Rome" in lines[1] and lines[2] == "tool_messages fides" and lines[3] == "True", lines


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"It is sunny in {city}."


@pytest.mark.parametrize("question", ["Where is the Eiffel Tower?", "Who wrote Hamlet?", "Where is Mount Everest?"])
def test_an_agent_with_a_second_tool_never_answers_nothing_silently(chat, search, question):
    """Measured before the answer rules: with a weather tool beside search, SmolLM2's answering turn began with
    <tool_response> (where the answer stops) and the agent answered ''."""
    agent = create_agent(chat, [search, get_weather], middleware=[retrieve_first])
    try:
        final = agent.invoke({"messages": [("user", question)]}, {"recursion_limit": 6})["messages"][-1]
    except ValueError as err:  # UnansweredError: the framework's own error, naming the cause
        assert "the model answered nothing: " in str(err)
        return
    print(f"[agent, two tools] {question!r} -> {final.content!r} notes={final.response_metadata['notes']}")
    assert isinstance(final, AIMessage) and not final.tool_calls and final.content.strip()
