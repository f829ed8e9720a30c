"""The agents' chat fields through a real server process (tiny random-weight model), with the `openai` client and
raw HTTP: forced tool calls streamed and not, response formats, logprobs, the FIDES record in headers, the no-op
values of unimplemented fields, and every bad agent request refused with a 400 naming its field."""

from __future__ import annotations

import json
import time

import httpx
import jsonschema
import openai
import pytest

DOCS = ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."]
ASK = [{"role": "user", "content": "Where is the Eiffel Tower?"}]
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the documents.",
        "parameters": {
            "type": "object",
            "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["k"],
        },
    },
}
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"enum": ["tower", "city"]}}, "required": ["word"]},
    },
}
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Rome", "Paris"]}},
    "required": ["city"],
    "additionalProperties": False,
}


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _chat(server, **kwargs):
    return _client(server).chat.completions.create(model="tiny", messages=ASK, extra_body={"documents": DOCS}, **kwargs)


def _arguments_valid(call, tools) -> None:
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "lookup"}}, "required"])
def test_a_forced_call_comes_back_as_message_tool_calls(server, choice):
    response = _chat(server, tools=[SEARCH, LOOKUP], tool_choice=choice, max_tokens=80)
    message, finish = response.choices[0].message, response.choices[0].finish_reason
    assert finish == "tool_calls" and message.content is None and len(message.tool_calls) == 1, response
    call = message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "lookup" or (choice == "required" and call.function.name == "search")
    _arguments_valid(call, [SEARCH, LOOKUP])
    assert response.model_extra["fides"]["tool_choice"] == (choice if isinstance(choice, str) else "lookup")


def test_a_streamed_forced_call_arrives_as_tool_call_deltas(server):
    whole = (
        _chat(server, tools=[SEARCH, LOOKUP], tool_choice="required", max_tokens=80).choices[0].message.tool_calls[0]
    )
    chunks = list(_chat(server, tools=[SEARCH, LOOKUP], tool_choice="required", max_tokens=80, stream=True))
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    first = deltas[0]
    assert (
        first.index == 0
        and first.id.startswith("call_")
        and first.type == "function"
        and first.function.name == whole.function.name
    )
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:]) and len(deltas) > 1
    assert "".join(d.function.arguments for d in deltas) == whole.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and chunks[-1].model_extra["fides"]["method"] == "fides"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)


def test_tool_choice_none_and_auto_answer_in_text(server):
    for choice in ("none", "auto"):
        response = _chat(server, tools=[SEARCH], tool_choice=choice, max_tokens=6)
        assert response.choices[0].finish_reason in ("stop", "length") and not response.choices[0].message.tool_calls


def test_a_tool_result_is_the_evidence_on_the_next_turn(server):
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": json.dumps({"k": 1})}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": DOCS[0]},
    ]
    response = _client(server).chat.completions.create(model="tiny", messages=messages, tools=[SEARCH], max_tokens=4)
    record = response.model_extra["fides"]
    assert record["documents_source"] == "tool_messages" and record["method"] == "fides" and record["fallback"] is None
    assert DOCS[0] in record["context_prompt"] and DOCS[0] not in record["no_context_prompt"]


@pytest.mark.parametrize(
    "response_format, schema",
    [
        ({"type": "json_schema", "json_schema": {"name": "answer", "schema": CITY, "strict": True}}, CITY),
        ({"type": "json_object"}, {"type": "object"}),
    ],
)
def test_response_formats_give_json_of_their_schema(server, response_format, schema):
    for stream in (False, True):
        if stream:
            chunks = list(_chat(server, response_format=response_format, max_tokens=80, stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            text = _chat(server, response_format=response_format, max_tokens=80).choices[0].message.content
        jsonschema.validate(json.loads(text), schema)


FREE_TEXT = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def _shortest(tiny_model_dir, schema) -> int:
    from transformers import AutoTokenizer

    from fides_rag.calls import shortest_answer_tokens

    return shortest_answer_tokens(AutoTokenizer.from_pretrained(tiny_model_dir), json_schema=schema)


def test_an_answer_the_grammar_closed_early_is_complete_finish_reason_stop(server, tiny_model_dir):
    budget = _shortest(tiny_model_dir, FREE_TEXT) + 3  # the random model never closes a free string: the budget does
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": FREE_TEXT, "strict": True}}
    raw = _client(server).chat.completions.with_raw_response.create(
        model="tiny", messages=ASK, max_tokens=budget, response_format=fmt, extra_body={"documents": DOCS}
    )
    response = raw.parse()
    record = response.model_extra["fides"]
    assert record["closed_early"] is True and raw.headers["x-fides-closed-early"] == "true"
    assert response.choices[0].finish_reason == "stop" and record["finish_reason"] != "length"
    jsonschema.validate(json.loads(response.choices[0].message.content), FREE_TEXT)
    chunks = list(_chat(server, response_format=fmt, max_tokens=budget, stream=True))
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert last.choices[0].finish_reason == "stop" and chunks[-1].model_extra["fides"]["closed_early"] is True
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == response.choices[0].message.content
    free = _client(server).chat.completions.with_raw_response.create(model="tiny", messages=ASK, max_tokens=3)
    assert (
        free.headers["x-fides-closed-early"] == "false" and free.parse().choices[0].finish_reason == "length"
    )  # a cut answer


@pytest.mark.parametrize("forced", [False, True])
def test_a_structured_answer_whose_max_tokens_cannot_hold_its_shortest_answer_is_refused(
    server, tiny_model_dir, forced
):
    from fides_rag.calls import ToolCalling

    if forced:
        schema = ToolCalling(None, [SEARCH], "search").constraint()
        fields = {"tools": [SEARCH], "tool_choice": {"type": "function", "function": {"name": "search"}}}
    else:
        schema, fields = (
            FREE_TEXT,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": FREE_TEXT, "strict": True},
                }
            },
        )
    needed = _shortest(tiny_model_dir, schema)
    for budget_field in ("max_tokens", "max_completion_tokens"):
        for stream in (False, True):
            body = {"messages": ASK, "documents": DOCS, budget_field: needed - 1, "stream": stream, **fields}
            response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
            error = response.json()["error"]
            assert (
                response.status_code == 400
                and error["param"] == budget_field
                and error["type"] == "invalid_request_error"
            ), error
            assert (
                f"{budget_field}={needed - 1} is fewer than the {needed} tokens" in error["message"]
                and f"at least {needed}" in error["message"]
            )
    answer = _chat(server, max_tokens=needed, **fields).choices[0]
    assert answer.finish_reason == ("tool_calls" if forced else "stop")


def test_logprobs_in_openai_shape_from_the_contrasted_distribution(server):
    response = _chat(server, logprobs=True, top_logprobs=3, max_tokens=6)
    content = response.choices[0].logprobs.content
    record = response.model_extra["fides"]
    assert 0 < len(content) == response.usage.completion_tokens
    for entry, step in zip(content, record["steps"]):
        assert (
            entry.logprob == step["logprob"]
            and entry.token == step["token"]
            and entry.bytes == list(entry.token.encode())
        )
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    streamed = list(_chat(server, logprobs=True, max_tokens=6, stream=True))
    lp = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in lp] == [e.logprob for e in content] and all(e.top_logprobs == [] for e in lp)
    assert _chat(server, max_tokens=3).choices[0].logprobs is None


def test_completions_logprobs(server):
    response = _client(server).completions.create(model="tiny", prompt="Where is it?", max_tokens=5, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert (
        len(logprobs.tokens)
        == len(logprobs.token_logprobs)
        == len(logprobs.top_logprobs)
        == len(logprobs.text_offset)
        > 0
    )
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)


def test_the_record_reaches_clients_as_headers(server):
    response = _client(server).chat.completions.with_raw_response.create(
        model="tiny", messages=ASK, max_tokens=4, extra_body={"documents": DOCS}
    )
    record = response.parse().model_extra["fides"]
    assert (
        response.headers["x-fides-method"] == record["method"] == "fides"
        and response.headers["x-fides-fallback"] == "none"
    )
    mean = sum(record["alphas"]) / len(record["alphas"])
    assert float(response.headers["x-fides-mean-alpha"]) == pytest.approx(mean, abs=1e-6)
    plain = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, "stream": True}, timeout=30
    )
    assert plain.headers["x-fides-method"] == "standard" and "no documents" in plain.headers["x-fides-fallback"]


def test_unimplemented_fields_are_accepted_at_their_no_op_values(server):
    response = _chat(server, max_tokens=3, frequency_penalty=0, presence_penalty=0, logit_bias={})
    assert response.choices[0].message.content is not None
    text = _client(server).completions.create(
        model="tiny", prompt="Hi", max_tokens=3, frequency_penalty=0, presence_penalty=0
    )
    assert text.choices[0].text is not None


BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "strin"}}}
UNCOMPILABLE = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
UNENFORCED = {"type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}}


def _fmt(schema, strict=None):
    return {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": schema, **({} if strict is None else {"strict": strict})},
    }


WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(600)}}
ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "schema, param, code, named",
    [
        (
            {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}},
            "response_format.json_schema.schema",
            "invalid_value",
            "the object at / lists 10000 properties, more than the grammar's limit of 1000",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a{1000000}$"}}},
            "response_format.json_schema.schema",
            "invalid_value",
            "the pattern at /properties/a/pattern repeats 1000000 times, more than the grammar's limit of 10000",
        ),
        (ENDLESS, "response_format.json_schema.schema", "invalid_value", "no finite JSON value matches the schema"),
        (
            WIDE,
            "response_format.json_schema.schema",
            "grammar_too_large",
            "the schema's largest object, at /, has 600 optional properties",
        ),
        (
            {"type": "object", "properties": {f"{i}": {} for i in range(600)}},
            "tools.0.function.parameters",
            "grammar_too_large",
            "the schema's largest object, at /, has 600 optional properties",
        ),  # short, so the prompt fits the window; a call forced to one tool is decoded as its parameters alone
    ],
)
def test_a_schema_past_the_grammars_limits_gets_a_400_at_once_naming_where(server, schema, param, code, named):
    if param.startswith("tools"):
        fields = {
            "tools": [{"type": "function", "function": {"name": "wide", "parameters": schema}}],
            "tool_choice": {"type": "function", "function": {"name": "wide"}},
        }
    else:
        fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    started = time.monotonic()
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 8, **fields}, timeout=60
    )
    error = response.json()["error"]
    assert time.monotonic() - started < 5.0 and response.status_code == 400, error
    assert error["param"] == param and error["code"] == code and named in error["message"], error


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": -1}, "presence_penalty"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        (
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": BAD_SCHEMA}}]},
            "tools.0.function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "array"}}}]},
            "tools.0.function.parameters",
        ),
        ({"tools": [SEARCH], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {"tools": [SEARCH], "tool_choice": {"type": "function", "function": {"name": "none"}}},
            "tool_choice",
        ),  # a function's name, not a mode
        ({"tools": [SEARCH], "tool_choice": "required", "stop": ["a"]}, "stop"),
        ({"response_format": _fmt(CITY, strict=True), "stop": ["i"]}, "stop"),
        ({"response_format": {"type": "json_object"}, "stop": "\n"}, "stop"),
        ({"tools": [{"type": "function", "function": {"name": "bad<|im_end|>"}}]}, "tools.0.function.name"),
        ({"tools": [SEARCH, {"type": "function", "function": {"name": "a" * 65}}]}, "tools.1.function.name"),
        ({"tools": [SEARCH, {"type": "function", "function": {"name": "other"}}, SEARCH]}, "tools.2.function.name"),
        (
            {"tools": [SEARCH, {**SEARCH, "function": {**SEARCH["function"], "description": "Another."}}]},
            "tools.1.function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": _fmt(UNCOMPILABLE)}, "response_format.json_schema.schema"),
        ({"response_format": _fmt(BAD_SCHEMA)}, "response_format.json_schema.schema"),
        (
            {"response_format": _fmt({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"})},
            "response_format.json_schema.schema",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "a",
                            "parameters": {
                                "type": "object",
                                "properties": {"b": {"$ref": "#/$defs/B"}},
                                "$defs": {"B": {"$ref": "#/$defs/B"}},
                            },
                        },
                    }
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"response_format": _fmt(UNENFORCED, strict=True)}, "response_format.json_schema.schema"),
        (
            {"tools": [{**SEARCH, "function": {**SEARCH["function"], "strict": True, "parameters": UNENFORCED}}]},
            "tools.0.function.parameters",
        ),
        ({"tools": [SEARCH], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True, "stream": True, "n": 2}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ],
)
def test_bad_agent_requests_get_a_400_naming_the_field(server, extra, param):
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, **extra}, timeout=30
    )
    error = response.json()["error"]
    assert response.status_code == 400 and error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"] and "does not exist" not in error["message"]
    if "$defs" in json.dumps(extra):
        assert "reference cycle with no content" in error["message"]


def test_a_strict_schema_keyword_the_grammar_ignores_is_noted_when_not_strict(server):
    response = _chat(server, response_format=_fmt(UNENFORCED), max_tokens=20)
    assert any("/properties/a/contentEncoding" in note for note in response.model_extra["fides"]["notes"])


def test_parallel_tool_calls_false_is_accepted(server):
    response = _chat(server, tools=[SEARCH], tool_choice="required", parallel_tool_calls=False, max_tokens=80)
    assert len(response.choices[0].message.tool_calls) == 1


def test_a_structured_answer_takes_an_end_of_turn_stop_and_is_never_cut_by_one(server):
    """A stop string could match inside a structured answer ("i" in "city") and cut it: refused (above); a stop that
    is one special token ends the answer only where it is complete."""
    for fields in ({"response_format": _fmt(CITY, strict=True)}, {"tools": [SEARCH], "tool_choice": "required"}):
        response = _chat(server, max_tokens=80, stop=["<|end|>"], **fields)
        message = response.choices[0].message
        if "response_format" in fields:
            jsonschema.validate(json.loads(message.content), CITY)
        else:
            _arguments_valid(message.tool_calls[0], [SEARCH])
