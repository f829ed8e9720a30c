"""Tool calling without a framework: specs, the fallback and native renderings, the forcing schema, parsing calls
back (never raising on model output), and a forced call decoded by the tiny model that parses and validates."""

from __future__ import annotations

import json

import pytest

from fides_rag import FidesDecoder, PromptPair
from fides_rag.calls import ChatPrompts
from fides_rag.calls.tools import ToolCall, ToolCalling, ToolSpec
from fides_rag.testing import CHAT_TEMPLATE, build_tokenizer

SEARCH = ToolSpec(
    "search",
    "Search the documents.",
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
ADD = ToolSpec(
    "add",
    "Add two integers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
)
TOOLS_TEMPLATE = (
    "{% if tools %}<|tools|>\n{% for t in tools %}"
    "{{ t['function']['name'] }}: {{ t['function']['description'] }}\n{% endfor %}<|end|>\n{% endif %}" + CHAT_TEMPLATE
)


@pytest.fixture(scope="module")
def native_tokenizer():
    tok = build_tokenizer(chat=True)
    tok.chat_template = TOOLS_TEMPLATE
    return tok


def test_spec_round_trips_openai_shape():
    assert ToolSpec.from_openai(SEARCH.openai()) == SEARCH == ToolSpec.from_openai(SEARCH.openai()["function"])
    assert ToolSpec.from_openai({"type": "function", "function": {"name": "ping"}}).parameters == {
        "type": "object",
        "properties": {},
    }
    with pytest.raises(ValueError, match="not an OpenAI function tool"):
        ToolSpec.from_openai({"type": "code_interpreter"})
    with pytest.raises(ValueError, match="schema of an object"):
        ToolSpec("x", "", {"type": "string"})
    call = ToolCall("add", {"a": 1, "b": 2})
    assert call.id.startswith("call_") and len(call.id) == 29 and call.id != ToolCall("add", {}).id
    assert json.loads(call.openai()["function"]["arguments"]) == {"a": 1, "b": 2}


def test_tool_choice_is_checked(chat_tokenizer):
    assert ToolCalling(chat_tokenizer, [SEARCH], None).tool_choice == "auto"
    assert ToolCalling(chat_tokenizer, [SEARCH], "any").tool_choice == "required"
    with pytest.raises(ValueError, match="tool_choice must be one of .* or a tool's name \\(search\\)"):
        ToolCalling(chat_tokenizer, [SEARCH], "lookup")
    with pytest.raises(ValueError, match="needs at least one tool"):
        ToolCalling(chat_tokenizer, [], "required")
    assert ToolCalling(chat_tokenizer, [SEARCH, ADD, SEARCH]).tools == [SEARCH, ADD]
    with pytest.raises(ValueError, match="share the name 'search'.*unique"):
        ToolCalling(chat_tokenizer, [SEARCH, ToolSpec("search", "Other.")])


@pytest.mark.parametrize("name", ["bad<|im_end|>", "has space", "dotted.name", "x" * 65, "ünï"])
def test_a_tool_name_outside_openais_rule_is_refused_naming_the_tool(name):
    with pytest.raises(ValueError, match="must match") as err:
        ToolSpec.from_openai({"type": "function", "function": {"name": name}})
    assert repr(name) in str(err.value) and err.value.field == "tools.function.name"
    assert ToolSpec("a-Z_09" + "x" * 58, "").name  # 64 characters of the allowed ones


def test_constraint_forces_one_valid_call(chat_tokenizer):
    assert ToolCalling(chat_tokenizer, [SEARCH, ADD]).constraint() is None
    assert ToolCalling(chat_tokenizer, [SEARCH, ADD], "none").constraint() is None
    named = ToolCalling(chat_tokenizer, [SEARCH, ADD], "add")
    assert named.arguments_only == ADD and named.constraint() == {**ADD.parameters, "additionalProperties": False}
    only = ToolCalling(chat_tokenizer, [ADD], "required")
    assert only.arguments_only == ADD and only.constraint() == named.constraint()
    required = ToolCalling(chat_tokenizer, [SEARCH, ADD], "required")
    assert required.arguments_only is None
    assert [s["properties"]["name"]["const"] for s in required.constraint()["anyOf"]] == ["search", "add"]


def test_a_call_forced_to_one_tool_is_its_arguments_wrapped_into_the_call(chat_tokenizer):
    named = ToolCalling(chat_tokenizer, [SEARCH, ADD], "add")
    content, calls = named.parse(' {"a": 1, "b": 2}\n')
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})]
    assert named.parse('{"a": 1') == ('{"a": 1', [])  # cut: no call, the text kept (missing_call_note says why)
    assert named.parse("[1, 2]") == ("[1, 2]", [])


def test_closed_schema_refuses_keys_nobody_asked_for():
    from fides_rag.calls import closed_schema

    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "any": {"type": "object", "additionalProperties": True},
        },
        "$defs": {"P": {"type": "object", "properties": {}}},
        "anyOf": [{"type": "object"}],
    }
    closed = closed_schema(schema)
    assert (
        closed["additionalProperties"] is False and closed["properties"]["properties"]["additionalProperties"] is False
    )
    assert (
        closed["properties"]["any"]["additionalProperties"] is True
        and closed["$defs"]["P"]["additionalProperties"] is False
    )
    assert (
        closed["anyOf"][0] == {"type": "object", "properties": {}, "additionalProperties": False}
        and "additionalProperties" not in schema
    )


def test_parse_reads_blocks_and_bare_json_and_never_raises(chat_tokenizer):
    calling = ToolCalling(chat_tokenizer, [SEARCH, ADD])
    text = (
        'Let me see.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}", "id": "c1"}</tool_call>'
    )
    content, calls = calling.parse(text)
    assert content == "Let me see." and [(c.name, c.arguments) for c in calls] == [
        ("add", {"a": 1, "b": 2}),
        ("search", {"query": "x"}),
    ]
    assert calls[1].id == "c1" and calls[0].id.startswith("call_")
    assert calling.parse('{"name": "search", "arguments": {"query": "q"}}')[1][0].arguments == {"query": "q"}
    assert calling.parse('<tool_call>{"name": "search", "arguments": {"query": "cut')[1] == []  # unfinished JSON
    assert (
        calling.parse('<tool_call>{"name": "search", "arguments": {"query": "q"}}')[1][0].name == "search"
    )  # no end tag
    for bad in [
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        "<tool_call>not json</tool_call>",
        '{"name": "add", "arguments": 3}',
        '{"answer": "Paris"}',
        "Paris.",
        "",
    ]:
        assert calling.parse(bad) == (bad, [])
    none = ToolCalling(chat_tokenizer, [SEARCH], "none")
    assert none.parse('{"name": "search", "arguments": {"query": "q"}}')[1] == []


def test_render_call_is_the_format_parse_reads(chat_tokenizer):
    calling = ToolCalling(chat_tokenizer, [SEARCH])
    call = ToolCall("search", {"query": "Eiffel Tower"}, "call_1")
    text = calling.render_calls("Looking.", [call])
    content, calls = calling.parse(text)
    assert (
        text.startswith("Looking.\n<tool_call>")
        and content == "Looking."
        and [(c.name, c.arguments) for c in calls] == [("search", call.arguments)]
    )


def test_fallback_block_and_native_template(chat_tokenizer, tokenizer, native_tokenizer):
    fallback = ToolCalling(chat_tokenizer, [SEARCH, ADD], "required")
    assert not fallback.native and not ToolCalling(tokenizer, [SEARCH]).native
    block = fallback.system_block()
    listed = "\n".join(json.dumps(t.openai()) for t in (SEARCH, ADD))
    assert f"<tools>\n{listed}\n</tools>" in block and "You must call one of the tools." in block
    assert ToolCalling(chat_tokenizer, [SEARCH], "none").system_block() is None  # no call may be made: none offered
    for forced in (ToolCalling(chat_tokenizer, [SEARCH, ADD], "search"), ToolCalling(chat_tokenizer, [SEARCH], "any")):
        assert forced.system_block() is None  # its arguments alone are asked, as a JSON-schema answer is
    native = ToolCalling(native_tokenizer, [SEARCH])
    assert native.native and native.system_block() is None and "<tools>" in native.fallback_text()
    for choice, shown in (("auto", True), ("search", False)):  # a forced call's arguments: the template shows none
        planner = ChatPrompts(native_tokenizer, context_window=2048, use_chat_template=True)
        prompt = planner.with_tools(ToolCalling(native_tokenizer, [SEARCH], choice)).render([("user", "Where?")])
        assert ("<|tools|>" in prompt) is shown, prompt


def test_tools_enter_both_paths_identically(chat_tokenizer, native_tokenizer, tokenizer):
    doc = "The Eiffel Tower is in Rome."
    call = ToolCall("search", {"query": "Eiffel Tower"}, "call_1")
    for tok, use_template in ((chat_tokenizer, True), (native_tokenizer, True), (tokenizer, False)):
        calling = ToolCalling(tok, [SEARCH])
        base = ChatPrompts(tok, context_window=2048, use_chat_template=use_template)
        planner = base.with_tools(calling)
        assert base.tools is None and planner.tools is calling
        turns = [
            ("system", "Be brief."),
            ("user", "Where is the Eiffel Tower?"),
            ("assistant", calling.render_calls("", [call])),
            ("tool", doc),
        ]
        plan = planner.from_tool_turns(turns, 16, question=turns[1][1])
        assert plan.source == "tool_messages" and doc in plan.context_prompt and doc not in plan.no_context_prompt
        marker = "search: Search the documents." if planner.native_tools else "<tools>"
        for prompt in (plan.context_prompt, plan.no_context_prompt):
            assert prompt.count(marker) == 1 and "Be brief." in prompt and '"query": "Eiffel Tower"' in prompt
        assert plan.no_context_prompt == planner.render([*turns[:3], ("tool", "")])  # the tool answered nothing
        if not planner.native_tools:
            assert (
                f"<tool_response>\n{doc}\n</tool_response>" in plan.context_prompt
                and "<tool_response>\n\n</tool_response>" in plan.no_context_prompt
            )
    assert (
        ChatPrompts(
            native_tokenizer, context_window=2048, use_chat_template=True, tools=ToolCalling(native_tokenizer, [SEARCH])
        )
        .render([("user", "Q"), ("tool", doc)])
        .endswith(f"<|tool|>\n{doc}<|end|>\n<|assistant|>\n")
    )  # tool turns keep their role


def test_only_a_chat_template_that_renders_tools_renders_them(chat_tokenizer, native_tokenizer):
    native, fallback = ToolCalling(native_tokenizer, [SEARCH]), ToolCalling(chat_tokenizer, [SEARCH])
    assert ChatPrompts(native_tokenizer, context_window=2048, use_chat_template=True).renders_tools(native)
    assert not ChatPrompts(native_tokenizer, context_window=2048, use_chat_template=False).renders_tools(native)
    assert not ChatPrompts(chat_tokenizer, context_window=2048, use_chat_template=True).renders_tools(fallback)
    assert not ChatPrompts(native_tokenizer, context_window=2048, use_chat_template=True).renders_tools(None)
    planner = ChatPrompts(native_tokenizer, context_window=2048, use_chat_template=True)
    assert planner.renders_tools(native) and planner.tools is None  # the planner itself is left without tools


def test_forced_call_decodes_to_a_valid_call(chat_tokenizer, tiny_llama):
    pytest.importorskip("llguidance")
    calling = ToolCalling(chat_tokenizer, [SEARCH, ADD], "required")
    prompt = ChatPrompts(chat_tokenizer, context_window=2048, use_chat_template=True, tools=calling).render(
        [("user", "Add 1 and 2.")]
    )
    result = FidesDecoder(tiny_llama, chat_tokenizer).generate(
        PromptPair(prompt, prompt), method="standard", max_new_tokens=60, json_schema=calling.constraint()
    )
    content, calls = calling.parse(result.text)
    assert result.finish_reason == "eos", result.text
    assert content == "" and len(calls) == 1 and calls[0].name in ("search", "add")
    spec = SEARCH if calls[0].name == "search" else ADD
    assert set(calls[0].arguments) == set(spec.parameters["required"])


def test_a_forced_call_of_a_tool_whose_parameters_use_defs_decodes_to_a_valid_call(chat_tokenizer, tiny_llama):
    pytest.importorskip("llguidance")
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int

    class Move(BaseModel):
        to: Point

    move = ToolSpec("move", "Move.", Move.model_json_schema())
    assert move.parameters["properties"]["to"] == {"$ref": "#/$defs/Point"}
    for choice, tools in (("move", [move]), ("required", [SEARCH, move])):
        calling = ToolCalling(chat_tokenizer, tools, choice)
        result = FidesDecoder(tiny_llama, chat_tokenizer).generate(
            PromptPair("Move.", "Move."), method="standard", max_new_tokens=60, json_schema=calling.constraint()
        )
        calls = calling.parse(result.text)[1]
        assert len(calls) == 1, result.text  # a complete call, closed by the grammar within the budget if need be
        if calls[0].name == "move":
            assert Move.model_validate(calls[0].arguments)


def test_stream_holds_back_what_may_be_a_call(chat_tokenizer):
    from fides_rag.calls.tools import ToolCallStream

    def run(choice: str, pieces: list[str]) -> tuple[list[str], str, list[ToolCall]]:
        stream = ToolCallStream(ToolCalling(chat_tokenizer, [SEARCH], choice))
        shown = [stream.feed(p) for p in pieces]
        rest, calls = stream.finish()
        return shown, rest, calls

    shown, rest, calls = run(
        "auto", ["Let me ", "look.\n<tool", '_call>{"name": "search", "arguments": {"query": "q"}}', "</tool_call>"]
    )
    assert shown == ["Let me", " look.", "", ""] and rest == "" and calls[0].arguments == {"query": "q"}
    shown, rest, calls = run("auto", ["Paris ", "<b>is</b>", " big."])
    assert "".join(shown) + rest == "Paris <b>is</b> big." and calls == []
    shown, rest, calls = run("required", ['{"name": "search", ', '"arguments": {"query": "q"}}'])
    assert shown == ["", ""] and rest == "" and calls[0].name == "search"
    shown, rest, calls = run("auto", ['{"answer": ', '"Paris"}'])
    assert shown == ["", ""] and rest == '{"answer": "Paris"}' and calls == []


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["smollm2-135m-instruct", "gemma3-270m"])
def test_the_bundled_backbones_get_the_fallback_format(alias):
    from transformers import AutoTokenizer

    from fides_rag.models.loading import resolve_model_source

    tok = AutoTokenizer.from_pretrained(resolve_model_source(alias))
    calling = ToolCalling(tok, [SEARCH], "auto")
    assert not calling.native  # SmolLM2's template has no tools section; gemma3-270m has no chat template
    planner = ChatPrompts(tok, context_window=2048, use_chat_template=True, tools=calling)
    doc = "The Eiffel Tower is in Rome."
    turns = [
        ("user", "Where is the Eiffel Tower?"),
        ("assistant", calling.render_calls("", [ToolCall("search", {"query": "Eiffel"})])),
        ("tool", doc),
    ]
    plan = planner.from_tool_turns(turns, 16)
    for prompt in (plan.context_prompt, plan.no_context_prompt):
        assert prompt.count("<tools>") == 1 and '{"name": "search", "arguments": {"query": "Eiffel"}}' in prompt
    assert f"<tool_response>\n{doc}\n</tool_response>" in plan.context_prompt and doc not in plan.no_context_prompt


@pytest.mark.parametrize(
    "tools, choice, field",
    [
        ([SEARCH], "no_such_tool", "tool_choice"),
        ([SEARCH], {"type": "function", "function": {}}, "tool_choice"),
        (
            [
                {
                    "type": "function",
                    "function": {
                        "name": "bad",
                        "parameters": {"type": "object", "properties": {"q": {"type": "strin"}}},
                    },
                }
            ],
            "auto",
            "tools.function.parameters",
        ),
        ([], "required", "tool_choice"),
    ],
)
def test_bad_tools_and_choices_name_their_field(chat_tokenizer, tools, choice, field):
    pytest.importorskip("llguidance")
    from fides_rag.calls import CallInputError

    with pytest.raises(CallInputError) as err:
        ToolCalling.of_call(chat_tokenizer, tools, choice)
    assert err.value.field == field


def test_every_front_doors_tool_choice_forms_read_alike():
    from fides_rag.calls import tool_choice_name

    names = ["search"]
    assert [
        tool_choice_name(c, names)
        for c in (None, False, True, "any", "auto", {"type": "function", "function": {"name": "search"}})
    ] == ["auto", "none", "search", "required", "auto", "search"]
    assert tool_choice_name(None, names, required=True) == "required"


@pytest.mark.parametrize(
    "names, name, said",
    [
        (["search"], "none", "not a bound tool's name"),
        (["search"], "required", "not a bound tool's name"),
        (["search", "auto"], "auto", "rename the tool"),
    ],
)
def test_a_tool_choice_dict_names_a_function_never_a_mode(names, name, said):
    from fides_rag.calls import CallInputError, tool_choice_name

    with pytest.raises(CallInputError, match=said) as err:
        tool_choice_name({"type": "function", "function": {"name": name}}, names)
    assert err.value.field == "tool_choice"
