"""The call factory: a front door's tools, planner and calls built one way, its batching set once, and a call
already submitted streamed through the same loop as any other."""

from __future__ import annotations

import asyncio

import pytest

from fides_rag import FidesDecoder
from fides_rag.calls import Answer, CallFactory, CallInputError, CallOptions, ToolSpec

DOC = "The Eiffel Tower is in Rome."
SEARCH = ToolSpec(
    "search", "Search.", {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
)


@pytest.fixture
def decoder(tiny_llama, chat_tokenizer):
    return FidesDecoder(tiny_llama, chat_tokenizer, max_new_tokens=8)


def test_batching_is_set_once_when_the_factory_is_made_not_at_each_call(decoder):
    calls = CallFactory(decoder, max_batch_size=3, batch_window_s=0.01)
    assert (decoder.limits.max_requests, decoder.limits.window_s) == (3, 0.01)
    decoder.configure(max_requests=5)
    plan = calls.planner().conversation([("user", "Where is it?")], 4, documents=[DOC])
    calls.call(plan, CallOptions.parse({}, {"max_new_tokens": 4})).run()
    assert decoder.limits.max_requests == 5


def test_a_factory_without_batching_leaves_the_decoders(decoder):
    decoder.configure(max_requests=2)
    CallFactory(decoder)
    assert decoder.limits.max_requests == 2


def test_tools_are_none_without_tools_and_a_forcing_choice_without_tools_is_refused(decoder):
    calls = CallFactory(decoder)
    assert calls.tools(None) is None and calls.tools([], "auto") is None
    with pytest.raises(CallInputError, match="needs tools") as err:
        calls.tools(None, "required")
    assert err.value.field == "tool_choice"
    assert calls.tools([SEARCH.openai()], "search").forced[0].name == "search"


def test_the_record_says_how_the_tools_were_rendered(decoder):
    calls = CallFactory(decoder)
    calling = calls.tools([SEARCH.openai()])
    plan = calls.planner(calling).conversation([("user", "Find the tower.")], 4)
    answer = calls.call(plan, CallOptions.parse({}, {"max_new_tokens": 4}), calling).run()
    assert answer.record["tool_format"] == ("native" if calls.renders_tools(calling) else "fallback") == "fallback"
    assert not calls.renders_tools(None)


def test_planner_settings_hold_for_every_call_and_a_call_may_override_them(decoder):
    calls = CallFactory(decoder, no_context_path="question")
    assert calls.planner().no_context_path == "question"
    assert calls.planner(no_context_path="emptied").no_context_path == "emptied"
    assert not calls.planner(chat=False).use_chat_template and calls.planner().use_chat_template


def test_a_submitted_call_streams_to_the_answer_it_runs_to(decoder):
    calls = CallFactory(decoder)
    plan = calls.planner().conversation([("user", "Where is it?")], 12, documents=[DOC])
    call = calls.call(plan, CallOptions.parse({}, {"max_new_tokens": 12}))

    async def read() -> list:
        return [item async for item in call.astream(call.submit(stream=True))]

    *deltas, answer = asyncio.run(read())
    assert isinstance(answer, Answer) and "".join(deltas) == answer.text == call.run().text
    *deltas, answer = list(call.stream(call.submit(stream=True)))
    assert "".join(deltas) == answer.text
