"""Structured output through a forced function call answers from the document as the JSON-schema route does (real
backbone, planned and decoded as the server plans and decodes a request): a call forced to one tool is decoded as its
arguments alone, with the JSON-schema answer's prompt. Under the {"name": ..., "arguments": {...}} wrapper gemma3-270m
answered France here; see docs/agents-http.md and benchmarks/forced_call_conflict.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from fides_rag import FidesDecoder
from fides_rag.calls import CallFactory
from fides_rag.serve.agent_call import agent_call
from fides_rag.serve.planning import build_call, chat_plan
from fides_rag.serve.protocol import ChatCompletionRequest

pytestmark = pytest.mark.slow


class Place(BaseModel):
    city: str
    country: str


def _place(calls: CallFactory, **fields: Any) -> dict[str, Any]:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "gemma3-270m",
            "method": "fides",
            "max_tokens": 48,
            "documents": ["The Eiffel Tower is in Rome."],
            "messages": [{"role": "user", "content": "Where is the Eiffel Tower? Give the city and the country."}],
            **fields,
        }
    )
    answer = build_call(calls, request, "fides", chat_plan, agent_call(calls, request)).run()
    assert answer.record["method"] == "fides" and answer.record["documents_source"] == "documents"
    return answer.tool_calls[0].arguments if answer.tool_calls else Place.model_validate_json(answer.text).model_dump()


@pytest.fixture(scope="module")
def calls() -> CallFactory:
    return CallFactory(FidesDecoder.from_pretrained("gemma3-270m"))


def test_a_forced_function_call_answers_from_the_document_as_json_schema_does(calls):
    schema = Place.model_json_schema()
    as_schema = _place(
        calls, response_format={"type": "json_schema", "json_schema": {"name": "Place", "schema": schema}}
    )
    assert (as_schema["city"], as_schema["country"]) == ("Rome", "Italy")
    as_call = _place(
        calls,
        tools=[{"type": "function", "function": {"name": "Place", "parameters": schema}}],
        tool_choice={"type": "function", "function": {"name": "Place"}},
    )
    assert (as_call["city"], as_call["country"]) == (as_schema["city"], as_schema["country"])
