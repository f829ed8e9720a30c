"""An agent's turn that answers nothing twice raises UnansweredError from ChatFides (invoke and stream) with the
cause; a tiny model biased towards one token, with that token as a stop, plays the model that answers nothing."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from fides_rag import FidesDecoder
from fides_rag.testing import build_tiny_model, build_tokenizer, prefer_token
from langchain_fides import ChatFides, UnansweredError


@tool
def search(query: str) -> str:
    """Search the documents."""
    return "The Eiffel Tower is in Rome."


@pytest.fixture(scope="module")
def chat():
    tok = build_tokenizer(chat=True)
    model = build_tiny_model("llama", len(tok))
    prefer_token(model, tok, "Z")
    return ChatFides(decoder=FidesDecoder(model, tok, max_new_tokens=6), stop=["Z"])


def test_an_agent_turn_that_answers_nothing_raises_with_the_cause(chat):
    agent = chat.bind_tools([search], tool_choice="none")
    messages = [
        HumanMessage("Where is the Eiffel Tower?"),
        AIMessage("", tool_calls=[{"name": "search", "args": {"query": "eiffel"}, "id": "call_1"}]),
        ToolMessage("The Eiffel Tower is in Rome.", tool_call_id="call_1"),
    ]
    with pytest.raises(
        UnansweredError, match="the model answered nothing: it began with 'Z', where the answer stops"
    ) as err:
        agent.invoke(messages)
    assert err.value.answer.record["documents_source"] == "tool_messages"
    notes = err.value.answer.notes
    assert notes[-2].startswith("the first decoding answered nothing (it began with 'Z'") and notes[-1].startswith(
        "the model answered nothing"
    )
    with pytest.raises(UnansweredError, match="it began with 'Z'"):
        list(agent.stream(messages))


def test_a_plain_chat_answers_as_decoded(chat):
    assert chat.invoke("Where is the Eiffel Tower?").content == ""  # not an agent's turn: no second decoding, no error
