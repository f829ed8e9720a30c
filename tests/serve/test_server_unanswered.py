"""Over HTTP, an agent's turn that answers nothing is decoded once more under the answer rules, and when it answers
nothing again the response (200) carries the cause in its record and headers. In-process app, tiny model biased
towards one token, with that token as a stop."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from fides_rag import FidesDecoder
from fides_rag.serve.app import build_app
from fides_rag.testing import build_tiny_model, prefer_token

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the documents.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
MESSAGES = [
    {"role": "user", "content": "Where is the Eiffel Tower?"},
    {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"query": "tower"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "The Eiffel Tower is in Rome."},
]


@pytest.fixture(scope="module")
def client(chat_tokenizer):
    model = build_tiny_model("llama", len(chat_tokenizer))
    prefer_token(model, chat_tokenizer, "Z")
    return TestClient(build_app(FidesDecoder(model, chat_tokenizer, max_new_tokens=6), model_name="tiny"))


def test_an_agent_turn_that_answers_nothing_says_why(client):
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": MESSAGES,
            "tools": [SEARCH],
            "tool_choice": "none",
            "stop": ["Z"],
            "max_tokens": 6,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    notes = body["fides"]["notes"]
    assert body["choices"][0]["message"]["content"] == "" and body["fides"]["documents_source"] == "tool_messages"
    assert notes[-2].startswith("the first decoding answered nothing (it began with 'Z'")
    assert (
        notes[-1]
        == "the model answered nothing: it began with 'Z', where the answer stops (a stop string), instead of answering"
    )
    assert "the model answered nothing" in response.headers["x-fides-notes"]


def test_a_streamed_agent_turn_that_answers_nothing_is_decoded_again_and_says_why(client):
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "tools": [SEARCH],
        "tool_choice": "none",
        "stop": ["Z"],
        "max_tokens": 6,
        "stream": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        chunks = [json.loads(line[len("data: ") :]) for line in response.iter_lines() if line.startswith("data: {")]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    notes = next(c["fides"]["notes"] for c in reversed(chunks) if c.get("fides"))
    assert content == ""
    assert notes[-2].startswith("the first decoding answered nothing (it began with 'Z'")
    assert notes[-1].startswith("the model answered nothing: it began with 'Z'")
