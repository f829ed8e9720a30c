"""An agent's turn that answers nothing twice raises UnansweredError from FidesLLM (chat and stream_chat) with the
cause; a tiny model biased towards one token, with that token as a stop, plays the model that answers nothing."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.tools import FunctionTool
from llama_index.llms.fides import FidesLLM, UnansweredError

from fides_rag import FidesDecoder
from fides_rag.testing import build_tiny_model, build_tokenizer, prefer_token


def search(query: str) -> str:
    """Search the documents."""
    return "The Eiffel Tower is in Rome."


@pytest.fixture(scope="module")
def llm():
    tok = build_tokenizer(chat=True)
    model = build_tiny_model("llama", len(tok))
    prefer_token(model, tok, "Z")
    return FidesLLM.from_decoder(FidesDecoder(model, tok, max_new_tokens=6), stop=["Z"])


def test_an_agent_turn_that_answers_nothing_raises_with_the_cause(llm):
    messages = [
        ChatMessage(role=MessageRole.USER, content="Where is the Eiffel Tower?"),
        ChatMessage(
            role=MessageRole.TOOL, content="The Eiffel Tower is in Rome.", additional_kwargs={"tool_call_id": "call_1"}
        ),
    ]
    tools = [FunctionTool.from_defaults(search)]
    with pytest.raises(
        UnansweredError, match="the model answered nothing: it began with 'Z', where the answer stops"
    ) as err:
        llm.chat(messages, tools=tools)
    assert err.value.answer.record["documents_source"] == "tool_messages"
    notes = llm.history[-1]["info"]["notes"]  # the record is kept in the history
    assert notes[-2].startswith("the first decoding answered nothing (it began with 'Z'") and notes[-1] == (
        "the model answered nothing: it began with 'Z', where the answer stops (a stop string), instead of answering"
    )
    with pytest.raises(UnansweredError, match="it began with 'Z'"):
        list(llm.stream_chat(messages, tools=tools))
