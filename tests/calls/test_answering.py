"""A call from plan to Answer through the facade: the same tokens as the decoder's own call, streamed deltas that
concatenate to the answer, role lines and tool markup as stops, and a forced call that gave none never an answer."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fides_rag import FidesDecoder
from fides_rag.calls import Answer, AnswerLog, Call, CallInputError, CallOptions, ChatPrompts, ToolCalling, ToolSpec

DOC = "The Eiffel Tower is in Rome."
TURNS = [("system", f"Context: {DOC}"), ("user", "Where is the Eiffel Tower?")]
SEARCH = ToolSpec(
    "search", "Search.", {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
)


@pytest.fixture(scope="module")
def decoder(tiny_llama, chat_tokenizer):
    return FidesDecoder(tiny_llama, chat_tokenizer, max_new_tokens=8)


def test_a_call_answers_as_the_decoder_does_and_records_its_plan(decoder):
    planner = ChatPrompts.for_decoder(decoder)
    plan = planner.conversation(TURNS, 8, documents=[DOC])
    answer = Call(decoder, plan, CallOptions.parse({}, {"max_new_tokens": 8}), extra={"model_name": "tiny"}).run()
    prompt, _ = plan.prompt()
    alone = decoder.submit(
        prompt, method="fides", max_new_tokens=8, stop=plan.stop_strings([], decoder.prompts.template)
    ).result()
    assert answer.result.token_ids == alone.token_ids and answer.text == alone.text
    assert answer.record["documents_source"] == "documents" and answer.record["requested_method"] == "fides"
    assert (
        answer.record["model_name"] == "tiny"
        and answer.finish_reason in ("stop", "length")
        and answer.usage["completion_tokens"] > 0
    )


def test_streamed_deltas_concatenate_to_the_answer(decoder):
    plan = ChatPrompts.for_decoder(decoder).conversation([("user", "Where is it?")], 12, documents=[DOC])
    assert plan.kind == "template"
    items = list(Call(decoder, plan, CallOptions.parse({}, {"max_new_tokens": 12})).stream())
    *deltas, answer = items
    assert (
        "".join(deltas) == answer.text == Call(decoder, plan, CallOptions.parse({}, {"max_new_tokens": 12})).run().text
    )


def test_role_lines_and_tool_markup_end_an_answer(decoder):
    plan = ChatPrompts.for_decoder(decoder).conversation(TURNS, 8)
    stops = Call(
        decoder, plan, CallOptions.parse({}, {"stop": ["END"]}), calling=ToolCalling(decoder.tokenizer, [SEARCH])
    ).decode_kwargs()["stop"]
    assert stops[0] == "END" and {"\nUser:", "\nQuestion:", "<tool_response>"} <= set(stops)


def test_the_same_messages_mean_the_same_context_without_documents(decoder):
    plan = ChatPrompts.for_decoder(decoder).conversation(TURNS, 8)
    assert plan.source == "system_message" and DOC not in plan.no_context_prompt and plan.fallback is None


def test_a_forced_call_refuses_a_second_grammar_naming_it(decoder):
    calling = ToolCalling(decoder.tokenizer, [SEARCH], "search")
    plan = ChatPrompts.for_decoder(decoder, tools=calling).conversation([("user", "Find the tower.")], 8)
    with pytest.raises(
        CallInputError, match="a forced tool_choice is decoded under its own grammar; drop regex="
    ) as err:
        Call(decoder, plan, CallOptions.parse({}, {"regex": "a+"}), calling=calling)
    assert err.value.field == "regex"


def test_a_forced_call_that_gave_none_is_never_an_answer(decoder):
    calling = ToolCalling(decoder.tokenizer, [SEARCH], "search")
    planner = ChatPrompts.for_decoder(decoder, tools=calling)
    plan = planner.conversation([("user", "Find the tower.")], 60)
    call = Call(decoder, plan, CallOptions.parse({}, {"max_new_tokens": 60}), calling=calling)
    cut = dataclasses.replace(
        call.run().result, text='{"name": "sea', finish_reason="length"
    )  # as a stop string could cut it
    answer = call.finish(cut)
    assert answer.tool_calls == [] and answer.text == "" and "forced a call, but none could be read" in answer.notes[-1]
    assert answer.record["tool_choice"] == "search" and answer.finish_reason == "length"


@pytest.mark.parametrize("forced", [True, False])
def test_a_structured_call_whose_budget_cannot_hold_its_shortest_answer_is_refused_before_decoding(decoder, forced):
    calling = ToolCalling(decoder.tokenizer, [SEARCH], "search") if forced else None
    plan = ChatPrompts.for_decoder(decoder, tools=calling).conversation([("user", "Find the tower.")], 3)
    options = CallOptions.parse({}, {"max_new_tokens": 3, **({} if forced else {"json_schema": ANSWER_SCHEMA})})
    call = Call(decoder, plan, options, calling=calling, structure=None if forced else True)
    requests = decoder.stats.requests
    for run in (call.run, lambda: list(call.stream())):
        with pytest.raises(
            ValueError, match=r"max_new_tokens=3 is fewer than the (\d+) tokens .* raise max_new_tokens to at least \1"
        ) as err:
            run()
        assert err.value.field == "max_new_tokens" and err.value.needed > 3
    assert decoder.stats.requests == requests


def test_deltas_hold_one_back_so_the_last_carries_the_answer(decoder):
    plan = ChatPrompts.for_decoder(decoder).conversation([("user", "Where is it?")], 12, documents=[DOC])
    pairs = list(Call(decoder, plan, CallOptions.parse({}, {"max_new_tokens": 12})).deltas())
    assert all(answer is None for _, answer in pairs[:-1]) and isinstance(pairs[-1][1], Answer)
    assert "".join(delta for delta, _ in pairs) == pairs[-1][1].text


def test_the_answer_log_keeps_the_newest_answers(decoder):
    log = AnswerLog(2)
    assert log.last is None and log.entries() == []
    plan = ChatPrompts.for_decoder(decoder).conversation(TURNS, 4, documents=[DOC])
    answers = [log.add(Call(decoder, plan, CallOptions.parse({}, {"max_new_tokens": n})).run()) for n in (2, 3, 4)]
    assert log.last is answers[-1].result and [e["info"] for e in log.entries()] == [a.record for a in answers[1:]]


ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def test_a_structured_answer_the_grammar_closed_early_is_complete_streamed_or_not(decoder):
    from fides_rag.calls import shortest_answer_tokens

    shortest = shortest_answer_tokens(decoder.tokenizer, json_schema=ANSWER_SCHEMA)
    plan = ChatPrompts.for_decoder(decoder).conversation(TURNS, shortest + 3, documents=[DOC])
    options = {"max_new_tokens": shortest + 3, "json_schema": ANSWER_SCHEMA}
    answer = Call(decoder, plan, CallOptions.parse({}, options), structure=True).run()
    assert answer.record["closed_early"] is True  # the random model never closes on its own: the budget did
    assert answer.finish_reason == "stop" and answer.record["finish_reason"] != "length"
    assert (
        answer.parsing_error is None and answer.parsed == json.loads(answer.text) and set(answer.parsed) == {"answer"}
    )
    streamed = list(Call(decoder, plan, CallOptions.parse({}, options), structure=True).stream())[-1]
    assert (
        streamed.finish_reason == "stop"
        and streamed.record["closed_early"] is True
        and streamed.parsed == answer.parsed
    )
    calling = ToolCalling(decoder.tokenizer, [SEARCH], "search")
    budget = shortest_answer_tokens(decoder.tokenizer, json_schema=calling.constraint()) + 3
    forced_plan = ChatPrompts.for_decoder(decoder, tools=calling).conversation([("user", "Find the tower.")], budget)
    forced = Call(decoder, forced_plan, CallOptions.parse({}, {"max_new_tokens": budget}), calling=calling).run()
    assert (
        [c.name for c in forced.tool_calls] == ["search"]
        and forced.finish_reason == "tool_calls"
        and forced.record["closed_early"]
    )
