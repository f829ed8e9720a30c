"""ChatFides tool calling and structured output on a tiny random-weight model: forced calls parse into
AIMessage.tool_calls (and one streamed chunk), tool messages are the evidence, every schema form parses."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel
from typing_extensions import TypedDict

from langchain_fides import ChatFides

DOC = "The Eiffel Tower is in Rome."
Q = "Where is the Eiffel Tower?"


@tool
def search(query: Literal["eiffel tower", "rome"]) -> str:
    """Search the documents."""
    return DOC


@tool
def weather(city: Literal["rome", "paris"]) -> str:
    """The weather in a city."""
    return "sunny"


class Answer(BaseModel):
    """The answer."""

    answer: Literal["rome", "paris"]


class AnswerDict(TypedDict):
    """The answer."""

    answer: Literal["rome", "paris"]


@pytest.fixture()
def chat(decoder):
    return ChatFides(decoder=decoder, max_new_tokens=120)


def test_forced_tool_call_parses_and_streams(chat):
    for choice in ("any", "required", "search", True, {"type": "function", "function": {"name": "search"}}):
        msg = chat.bind_tools([search], tool_choice=choice).invoke(Q)
        assert msg.content == "" and [c["name"] for c in msg.tool_calls] == ["search"], msg
        assert msg.tool_calls[0]["args"]["query"] in ("eiffel tower", "rome") and msg.tool_calls[0]["id"].startswith(
            "call_"
        )
        assert (  # one tool forced: its arguments alone are asked, with no tool block (a JSON-schema answer's prompt)
            msg.response_metadata["tool_format"] == "fallback"
            and "<tools>" not in msg.response_metadata["context_prompt"]
        )
    strict = (
        chat.model_copy(update={"strict": True}).bind_tools([search], tool_choice="any").invoke(Q)
    )  # not a fallback:
    assert strict.response_metadata["notes"] == [
        "tools are bound and no tool has answered yet: decoded with 'standard' on the prompt as given"
    ]
    chunks = list(chat.bind_tools([search], tool_choice="search").stream(Q))
    assert [c.content for c in chunks] == [""] and chunks[-1].tool_call_chunks[0]["name"] == "search"
    assert chunks[-1].tool_calls[0]["args"] == json.loads(chunks[-1].tool_call_chunks[0]["args"])


def test_bad_tool_choice_and_cut_calls_are_reported(chat, caplog):
    with pytest.raises(ValueError, match="bound tool's name \\(search\\)"):
        chat.bind_tools([search], tool_choice="lookup")
    with pytest.raises(ValueError, match="needs tools"):
        chat.invoke(Q, tool_choice="any")
    with pytest.raises(ValueError, match="drop json_schema="):
        chat.bind_tools([search], tool_choice="any").invoke(Q, json_schema={"type": "object"})
    with pytest.raises(ValueError, match=r"max_new_tokens=3 is fewer than the (\d+) tokens .* at least \1"):
        chat.bind_tools([search], tool_choice="any").invoke(
            Q, max_new_tokens=3
        )  # a call cannot fit: refused before decoding


def test_tool_messages_are_the_evidence_and_calls_render_in_history(chat):
    call = {"name": "search", "args": {"query": "eiffel tower"}, "id": "call_1", "type": "tool_call"}
    history = [HumanMessage(Q), AIMessage("", tool_calls=[call]), ToolMessage(DOC, tool_call_id="call_1")]
    msg = chat.bind_tools([search]).invoke(history)
    meta = msg.response_metadata
    assert meta["documents_source"] == "tool_messages" and meta["method"] == "fides" and meta["num_documents"] == 1
    assert DOC in meta["context_prompt"] and DOC not in meta["no_context_prompt"]
    rendered = '<tool_call>\n{"name": "search", "arguments": {"query": "eiffel tower"}}\n</tool_call>'
    for prompt in (meta["context_prompt"], meta["no_context_prompt"]):
        assert rendered in prompt and prompt.count("<tools>") == 1
    last = list(chat.bind_tools([search]).stream(history))[-1]
    assert last.response_metadata["documents_source"] == "tool_messages"


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_for_every_schema_form(chat, method):
    assert isinstance(chat.with_structured_output(Answer, method=method).invoke(Q), Answer)
    assert chat.with_structured_output(AnswerDict, method=method).invoke(Q)["answer"] in ("rome", "paris")
    schema = Answer.model_json_schema()
    assert chat.with_structured_output(schema, method=method).invoke(Q)["answer"] in ("rome", "paris")
    raw = chat.with_structured_output(Answer, method=method, include_raw=True).invoke(Q)
    assert isinstance(raw["raw"], AIMessage) and isinstance(raw["parsed"], Answer) and raw["parsing_error"] is None
    tight = chat.model_copy(
        update={"max_new_tokens": 2}
    )  # no answer fits: refused before decoding, never a partial object
    for structured in (
        tight.with_structured_output(Answer, method=method, include_raw=True),
        tight.with_structured_output(AnswerDict, method=method),
    ):
        with pytest.raises(ValueError, match="max_new_tokens=2 is fewer than the .* raise max_new_tokens to at least"):
            structured.invoke(Q)


class Said(BaseModel):
    """Free text, which the random model never closes on its own."""

    said: str


def test_a_structured_answer_the_grammar_closed_early_parses_as_complete(chat, decoder):
    from fides_rag.calls import constraint_of, shortest_answer_tokens

    schema = constraint_of(json_schema=Said)["json_schema"]
    budget = shortest_answer_tokens(decoder.tokenizer, json_schema=schema) + 3
    tight = chat.model_copy(update={"max_new_tokens": budget})
    raw = tight.with_structured_output(Said, method="json_schema", include_raw=True).invoke(Q)
    meta = raw["raw"].response_metadata
    assert meta["closed_early"] is True and meta["finish_reason"] != "length"  # closed by the budget, complete
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Said)
    assert isinstance(tight.with_structured_output(Said, method="json_schema").invoke(Q), Said)


def test_structured_output_checks_its_arguments(chat):
    raw = chat.with_structured_output(method="json_mode", include_raw=True).invoke(
        Q
    )  # any object: random weights ramble
    assert raw["raw"].content.startswith("{") and (
        isinstance(raw["parsed"], dict) or "cut at max_new_tokens" in str(raw["parsing_error"])
    )
    with pytest.raises(ValueError, match="method must be one of"):
        chat.with_structured_output(Answer, method="xml")
    with pytest.raises(ValueError, match="needs a schema"):
        chat.with_structured_output(None)
    with pytest.raises(ValueError, match="unsupported arguments"):
        chat.with_structured_output(Answer, temperature=0)


def test_a_template_that_renders_tools_gets_them_natively():
    from fides_rag import FidesDecoder
    from fides_rag.testing import CHAT_TEMPLATE, build_tiny_model, build_tokenizer

    tok = build_tokenizer(chat=True)
    tok.chat_template = (
        "{% for t in tools or [] %}<|tool-def|>{{ t['function']['name'] }}<|end|>\n{% endfor %}" + CHAT_TEMPLATE
    )
    chat = ChatFides(decoder=FidesDecoder(build_tiny_model("llama", len(tok)), tok), max_new_tokens=80)
    call = {"name": "search", "args": {"query": "rome"}, "id": "call_1", "type": "tool_call"}
    history = [HumanMessage(Q), AIMessage("", tool_calls=[call]), ToolMessage(DOC, tool_call_id="call_1")]
    msg = chat.bind_tools([search, weather], tool_choice="any").invoke(history)  # a call of one of two: tools shown
    meta = msg.response_metadata
    assert meta["tool_format"] == "native" and msg.tool_calls[0]["name"] in ("search", "weather")
    assert meta["documents_source"] == "tool_messages" and meta["method"] == "fides"
    for prompt in (meta["context_prompt"], meta["no_context_prompt"]):
        assert (
            prompt.count("<|tool-def|>search") == 1 and "<tools>" not in prompt and "<|tool|>\n" in prompt
        )  # the tool role kept
    forced = chat.bind_tools([search, weather], tool_choice="search").invoke(history).response_metadata
    assert "<|tool-def|>" not in forced["context_prompt"]  # one tool forced: its arguments alone, no tools shown
    assert f"<|tool|>\n{DOC}<|end|>" in meta["context_prompt"] and "<|tool|>\n<|end|>" in meta["no_context_prompt"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_call_options_pass_through_every_structured_output_wrapper(chat, method):
    structured = chat.with_structured_output(Answer, method=method, include_raw=True)
    for budget in (5, 90):  # 5 tokens cannot hold the answer: refused, which shows the budget reached the call
        for runnable, kwargs in (
            (structured, {"documents": [DOC], "max_new_tokens": budget}),
            (structured.bind(documents=[DOC], max_new_tokens=budget), {}),
            (structured.with_config(tags=["t"]), {"documents": [DOC], "max_new_tokens": budget}),
        ):
            if budget == 5:
                with pytest.raises(ValueError, match="max_new_tokens=5 is fewer than the"):
                    runnable.invoke(Q, **kwargs)
                continue
            raw = runnable.invoke(Q, **kwargs)["raw"]
            meta = raw.response_metadata
            assert meta["documents_source"] == "documents" and meta["method"] == "fides", meta["notes"]
            assert meta["completion_tokens"] <= budget
    with pytest.raises(TypeError, match="unsupported call options"):
        structured.invoke(Q, no_such_option=1)  # refused, never dropped
