"""Structured output under a token budget: the decoder forces the grammar's shortest completion in the last tokens,
so a random-weight model (which writes garbage and never closes on its own) still returns JSON that validates,
under every method, streamed or not, complete (finish_reason "eos" or "stop", never "length") with `closed_early`
set."""

from __future__ import annotations

import json

import jsonschema
import pytest

from fides_rag import FidesDecoder, PromptTemplate, available_methods, get_method, load_model
from fides_rag.calls import ToolCalling, ToolSpec
from fides_rag.generation.grammar.constraint import BudgetBelowShortestAnswer, GrammarConstraint

QUESTION, DOCUMENTS = (
    "Which city is the capital of France?",
    ["Lyon is the capital of France.", "Paris is a large city."],
)
METHODS = {name: {"decore": dict(heads={1: [0]})}.get(name, {}) for name in available_methods()}
SCHEMAS = {
    "string": {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {
                    "b": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
                    "c": {"enum": ["red", "green"]},
                },
                "required": ["b", "c"],
            },
            "n": {"type": "number"},
            "s": {"type": "string", "minLength": 3},
        },
        "required": ["a", "n", "s"],
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "score": {"type": "integer"}},
                    "required": ["name", "score"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
}
TOOL = ToolSpec(
    "lookup",
    "Look a word up.",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
        "required": ["query", "k"],
    },
)


@pytest.fixture
def decoder(tiny_llama, tokenizer):
    return FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))


def shortest(tokenizer, schema) -> int:
    """Tokens the schema's shortest document takes in this tokenizer."""
    return len(GrammarConstraint.compile(tokenizer, json_schema=schema).start().completion(200))


def check(result, schema, budget: int) -> None:
    jsonschema.validate(json.loads(result.text), schema)
    assert len(result.token_ids) <= budget
    if result.closed_early:
        assert result.finish_reason in ("eos", "stop")  # complete: closed by the grammar, not cut
    assert result.to_metadata()["closed_early"] == result.closed_early


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_closes_every_schema_within_a_small_budget(decoder, tokenizer, method):
    rule = get_method(method, **METHODS[method])
    closed = 0
    for schema in (SCHEMAS["string"], SCHEMAS["nested"]):
        budget = shortest(tokenizer, schema) + 6
        result = decoder.generate(QUESTION, DOCUMENTS, method=rule, json_schema=schema, max_new_tokens=budget)
        check(result, schema, budget)
        closed += result.closed_early
    assert closed  # the random model does not close on its own: the budget did


@pytest.mark.parametrize("budget_over_shortest", [0, 1, 3, 9, 25])
def test_any_budget_from_the_shortest_document_up_closes(decoder, tokenizer, budget_over_shortest):
    for schema in SCHEMAS.values():
        budget = shortest(tokenizer, schema) + budget_over_shortest
        check(
            decoder.generate(QUESTION, DOCUMENTS, method="fides", json_schema=schema, max_new_tokens=budget),
            schema,
            budget,
        )


@pytest.mark.parametrize("method", ["standard", "fides", "dola", "dvd"])
def test_a_streamed_answer_closes_and_its_deltas_make_the_final_text(decoder, tokenizer, method):
    schema = SCHEMAS["nested"]
    budget = shortest(tokenizer, schema) + 5
    stream = decoder.stream(QUESTION, DOCUMENTS, method=method, json_schema=schema, max_new_tokens=budget)
    text = "".join(stream)
    assert text == stream.result.text
    check(stream.result, schema, budget)
    assert stream.result.closed_early


def test_a_forced_tool_call_cut_by_the_budget_still_parses_as_a_valid_call(decoder, tokenizer):
    calling = ToolCalling(tokenizer, [TOOL], tool_choice="lookup")
    schema = calling.constraint()
    budget = shortest(tokenizer, schema) + 4
    for method in ("standard", "fides", "cad"):
        result = decoder.generate(QUESTION, DOCUMENTS, method=method, json_schema=schema, max_new_tokens=budget)
        _, calls = calling.parse(result.text)
        assert [c.name for c in calls] == ["lookup"] and result.closed_early
        jsonschema.validate(calls[0].arguments, TOOL.parameters)


def test_batched_requests_each_close_as_alone(decoder, tokenizer):
    budgets = {name: shortest(tokenizer, s) + 3 for name, s in SCHEMAS.items()}
    handles = [
        decoder.submit(QUESTION, DOCUMENTS, method="fides", json_schema=s, max_new_tokens=budgets[n])
        for n, s in SCHEMAS.items()
    ]
    for (name, schema), handle in zip(SCHEMAS.items(), handles):
        together = handle.result()
        check(together, schema, budgets[name])
        assert (
            together.token_ids
            == decoder.generate(
                QUESTION, DOCUMENTS, method="fides", json_schema=schema, max_new_tokens=budgets[name]
            ).token_ids
        )


def test_an_answer_that_ends_on_its_own_is_untouched(decoder):
    regex = r"[A-Z][a-z]{2,8}"  # the random model ends this one by itself, well inside the budget
    free = decoder.generate(QUESTION, DOCUMENTS, method="fides", regex=regex, max_new_tokens=60)
    tight = decoder.generate(QUESTION, DOCUMENTS, method="fides", regex=regex, max_new_tokens=len(free.token_ids))
    assert free.finish_reason == "eos" and not free.closed_early
    assert tight.token_ids == free.token_ids and not tight.closed_early


@pytest.mark.parametrize(
    "spec",
    [
        dict(json_schema=SCHEMAS["nested"]),
        dict(json_schema=TOOL.parameters),
        dict(regex=r"(yes|no), because [a-z]{3}\."),
    ],
)
def test_a_budget_below_the_shortest_answer_is_refused_before_decoding_naming_the_minimum(decoder, tokenizer, spec):
    needed = len(GrammarConstraint.compile(tokenizer, **spec).start().completion(200))
    requests = decoder.stats.requests
    for budget in (1, needed - 1):
        with pytest.raises(
            BudgetBelowShortestAnswer,
            match=f"max_new_tokens={budget} is fewer than the {needed} tokens .* at least {needed}",
        ) as err:
            decoder.generate(QUESTION, DOCUMENTS, method="standard", max_new_tokens=budget, **spec)
        assert isinstance(err.value, ValueError) and err.value.field == "max_new_tokens" and err.value.needed == needed
        with pytest.raises(BudgetBelowShortestAnswer):
            decoder.submit(QUESTION, DOCUMENTS, max_new_tokens=budget, stream=True, **spec)
    assert decoder.stats.requests == requests  # nothing was queued
    result = decoder.generate(QUESTION, DOCUMENTS, method="standard", max_new_tokens=needed, **spec)
    assert (
        result.finish_reason != "length" and len(result.token_ids) <= needed
    )  # the minimum itself holds a complete answer


COUNTED = [  # where states alike hide the way out (a count, or one byte of a class): the first search finds none
    {"type": "string", "minLength": 60},
    {"type": "string", "pattern": "x"},
    {"type": "integer", "minimum": 10**12},
    {"type": "array", "items": {"type": "string"}, "minItems": 40},
    {"type": "array", "items": {"type": "string", "minLength": 30}, "minItems": 3},
    {
        "type": "object",
        "properties": {"a": {"type": "string", "minLength": 20}, "b": {"type": "null"}},
        "required": ["a", "b"],
    },
]


@pytest.mark.parametrize("schema", COUNTED)
def test_an_answer_whose_way_out_is_a_count_is_found_and_closes_within_the_budget(decoder, tokenizer, schema):
    path = GrammarConstraint.compile(tokenizer, json_schema=schema).shortest_answer(64)
    assert path is not None
    jsonschema.validate(json.loads(tokenizer.decode(path)), schema)
    with pytest.raises(BudgetBelowShortestAnswer):  # refused up front, not cut
        decoder.generate(QUESTION, DOCUMENTS, method="standard", json_schema=schema, max_new_tokens=len(path) - 1)
    for budget in (len(path), len(path) + 5):
        result = decoder.generate(QUESTION, DOCUMENTS, method="fides", json_schema=schema, max_new_tokens=budget)
        check(result, schema, budget)
        assert result.finish_reason != "length"


def test_stop_strings_never_cut_a_structured_answer(decoder, tokenizer):
    """A stop string can match inside a structured answer ("a" in a key, a quote): it is not matched there, the grammar
    ends the answer; only a stop that is one special token ends it as EOS does, where it is complete."""
    schema = SCHEMAS["string"]
    budget = shortest(tokenizer, schema) + 6
    for stop in (["a", '"', "}"], ['"answer"']):
        check(
            decoder.generate(
                QUESTION, DOCUMENTS, method="standard", json_schema=schema, max_new_tokens=budget, stop=stop
            ),
            schema,
            budget,
        )
    request = decoder._requests.build(QUESTION, DOCUMENTS, json_schema=schema, stop=["a", "<|end|>"])
    ends = request.constraint.eos_token_ids
    assert (
        request.text_stops == ()
        and tokenizer.convert_tokens_to_ids("<|end|>") in ends
        and tokenizer.convert_tokens_to_ids("a") not in ends
    )
    assert decoder._requests.build(QUESTION, DOCUMENTS, stop=["a"]).text_stops[-1] == "a"  # free text: matched as ever


def test_the_completion_is_a_real_one_for_regex_and_lark(tokenizer):
    for spec in (
        dict(regex=r"(yes|no), because [a-z]+\."),
        dict(grammar='start: "(" item ("," item)* ")"\nitem: /[0-9]+/'),
    ):
        state = GrammarConstraint.compile(tokenizer, **spec).start()
        for token in tokenizer.encode("(12" if "grammar" in spec else "no, be", add_special_tokens=False):
            state.accept(token)
        path = state.completion()
        for token in path:
            state.accept(token)
        assert path and state.is_complete()


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["smollm2-135m-instruct", "gemma3-270m"])
def test_real_backbone_structured_answers_cut_by_the_budget_still_validate(alias):
    decoder = FidesDecoder(*load_model(alias))
    schema = SCHEMAS["string"]
    questions = ["Who wrote Hamlet? Quote the passage in full.", "Describe Paris at length."]
    documents = [["Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601. " * 3]] * 2
    for method in ("standard", "cad", "fides"):
        results = decoder.generate_batch(questions, documents, method=method, json_schema=schema, max_new_tokens=7)
        for result in results:
            check(result, schema, 7)
        assert any(r.closed_early for r in results)


def test_a_stop_token_of_the_request_ends_the_grammar_only_where_the_answer_is_complete(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=("<|end|>",)))
    schema = SCHEMAS["string"]
    result = decoder.generate(
        QUESTION, DOCUMENTS, method="standard", json_schema=schema, max_new_tokens=shortest(tokenizer, schema) + 8
    )
    jsonschema.validate(json.loads(result.text), schema)
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    assert end not in result.token_ids[:-1]
    request = decoder._requests.build(QUESTION, DOCUMENTS, json_schema=schema, stop=["<|end|>"])
    assert end in request.constraint.eos_token_ids
