"""An agent's turn that answers nothing is decoded again under the answer rules (end of turn and markup barred from
its first token); when that answers nothing either, the Answer carries the cause. A model biased towards one token
plays the model that ends its turn at once, or stops where a stop string begins."""

from __future__ import annotations

import pytest

from fides_rag import FidesDecoder
from fides_rag.calls import Call, CallOptions, ChatPrompts, ToolCalling, ToolSpec, UnansweredError
from fides_rag.calls.unanswered import call_shaped, is_agent_turn, unanswered_cause
from fides_rag.testing import build_tiny_model

SEARCH = ToolSpec(
    "search", "Search.", {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
)
TURNS = [("user", "Where is the Eiffel Tower?")]


@pytest.fixture(scope="module")
def biased(chat_tokenizer):
    """A decoder whose model prefers `bias["token"]` by far (None: no preference)."""
    model = build_tiny_model("llama", len(chat_tokenizer))
    bias = {"token": None}

    def prefer(module, inputs, logits):
        if bias["token"] is not None:
            logits = logits.clone()
            logits[..., bias["token"]] += 1000.0
        return logits

    model.lm_head.register_forward_hook(prefer)
    return FidesDecoder(model, chat_tokenizer, max_new_tokens=6), bias


def _call(decoder, tool_choice="auto", **options):
    calling = ToolCalling(decoder.tokenizer, [SEARCH], tool_choice)
    plan = ChatPrompts.for_decoder(decoder, tools=calling).conversation(TURNS, 6)
    return Call(decoder, plan, CallOptions.parse({}, {"max_new_tokens": 6, **options}), calling=calling)


def test_a_turn_that_ends_at_once_is_decoded_again_and_answers(biased):
    decoder, bias = biased
    bias["token"] = decoder.tokenizer.eos_token_id
    try:
        answer = _call(decoder).run()
        *deltas, streamed = _call(decoder).stream()
    finally:
        bias["token"] = None
    assert answer.text.strip() and answer.unanswered is None
    assert any(n.startswith("the first decoding answered nothing (it ended its turn at once") for n in answer.notes)
    assert "".join(deltas) == streamed.text == answer.text


def test_a_turn_that_answers_nothing_twice_carries_the_cause(biased):
    decoder, bias = biased
    z = decoder.tokenizer("Z", add_special_tokens=False)["input_ids"][0]
    bias["token"] = z
    try:
        answer = _call(decoder, stop=["Z"]).run()
    finally:
        bias["token"] = None
    assert (
        answer.text == ""
        and answer.unanswered == "it began with 'Z', where the answer stops (a stop string), instead of answering"
    )
    assert f"the model answered nothing: {answer.unanswered}" in answer.notes
    with pytest.raises(UnansweredError, match="the model answered nothing: it began with 'Z'"):
        raise UnansweredError(answer.unanswered, answer)


def test_a_tool_call_written_as_the_answer_is_not_an_answer(biased):
    decoder, _ = biased
    call = _call(decoder, tool_choice="none")
    result = call.run().result
    cause = unanswered_cause(call, '{"name": "weather", "arguments": {"city": "Rome"}}', [], result)
    assert cause == (
        """it wrote a tool call as its answer ('{"name": "weather", "arguments": {"city": "Rome"}}') where """
        "tool_choice='none' allows no call"
    )
    assert unanswered_cause(call, "Rome", [], result) is None


@pytest.mark.parametrize(
    "text, shaped",
    [
        ('{"name": "Mountain range, Switzerland, 2", "arguments": {}}', True),  # measured on smollm2-135m-instruct
        ('<tool_call>\n{"name": "search", "argu', True),
        ('[{"function": "search"}]', True),
        ("Rome", False),
        ('{"city": "Rome"}', False),
        ("The name is Rome", False),
    ],
)
def test_call_shaped_answers(text, shaped):
    assert call_shaped(text) is shaped


def test_only_a_free_text_turn_of_an_agent_is_held_to_the_answer_rules(biased):
    decoder, _ = biased
    assert is_agent_turn(_call(decoder)) and is_agent_turn(_call(decoder, tool_choice="none"))
    assert not is_agent_turn(_call(decoder, tool_choice="search"))  # a forced call
    plain = ChatPrompts.for_decoder(decoder).conversation(TURNS, 6)
    assert not is_agent_turn(Call(decoder, plain, CallOptions.parse({}, {})))
