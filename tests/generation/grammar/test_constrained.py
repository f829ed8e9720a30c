"""Grammar-constrained decoding through the decoder and the engine: every method yields JSON valid under its
schema; an always-true grammar changes nothing; requests with different grammars share the steps."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field

from fides_rag import FidesDecoder, PromptTemplate, available_methods, get_method, load_model
from fides_rag.generation.grammar.constraint import GrammarConstraint

ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 12}},
    "required": ["answer"],
    "additionalProperties": False,
}
TOOL = {
    "type": "object",
    "properties": {
        "name": {"enum": ["search", "lookup"]},
        "arguments": {
            "type": "object",
            "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["k"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
QUESTION, DOCUMENTS = (
    "Which city is the capital of France?",
    ["Lyon is the capital of France.", "Paris is a large city."],
)
METHODS = {name: {"decore": dict(heads={1: [0]})}.get(name, {}) for name in available_methods()}


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=12)


def valid(result, schema) -> dict:
    assert result.finish_reason == "eos", result
    data = json.loads(result.text)
    jsonschema.validate(data, schema)
    return data


@pytest.fixture
def decoder(tiny_llama, tokenizer):
    return FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_yields_valid_json(decoder, method):
    rule = get_method(method, **METHODS[method])
    valid(decoder.generate(QUESTION, DOCUMENTS, method=rule, json_schema=ANSWER, max_new_tokens=40), ANSWER)
    valid(decoder.generate(QUESTION, DOCUMENTS, method=rule, json_schema=TOOL, max_new_tokens=40), TOOL)


@pytest.mark.parametrize("method", ["standard", "cad", "fides", "dvd"])
def test_an_always_true_grammar_changes_no_token(decoder, method):
    free = decoder.generate(QUESTION, DOCUMENTS, method=method, max_new_tokens=12)
    held = decoder.generate(QUESTION, DOCUMENTS, method=method, max_new_tokens=12, grammar=GrammarConstraint.any_text())
    assert held.token_ids == free.token_ids and held.alphas == free.alphas


def test_different_grammars_share_a_batch_and_each_equals_alone(decoder):
    kinds = [
        dict(json_schema=ANSWER),
        dict(json_schema=TOOL),
        dict(regex=r"[A-Z][a-z]{2,8}"),
        dict(json_schema=Answer),
        {},
    ]
    questions = [QUESTION, "Who chose Canberra?", "What jumps?", "Where is it?", "What is it?"]
    together = [decoder.submit(q, DOCUMENTS, method="fides", max_new_tokens=60, **k) for q, k in zip(questions, kinds)]
    results = [h.result() for h in together]
    for q, k, got in zip(questions, kinds, results):
        assert got.token_ids == decoder.generate(q, DOCUMENTS, method="fides", max_new_tokens=60, **k).token_ids
    valid(results[0], ANSWER), valid(results[1], TOOL), valid(results[3], Answer.model_json_schema())
    assert results[2].finish_reason == "eos" and results[2].text[0].isupper() and results[2].text[1:].islower()
    assert decoder.stats.largest_batch >= 2


def test_bad_grammar_input_is_refused_before_decoding(decoder):
    with pytest.raises(ValueError, match="at most one of json_schema=, regex= and grammar="):
        decoder.generate(QUESTION, DOCUMENTS, json_schema=ANSWER, regex="a+")
    with pytest.raises(ValueError, match="json_schema is not valid JSON"):
        decoder.generate(QUESTION, DOCUMENTS, json_schema="{not json")
    with pytest.raises(ValueError, match="regex must be a string"):
        decoder.generate(QUESTION, DOCUMENTS, regex=3)


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["smollm2-135m-instruct", "gemma3-270m"])
def test_real_backbones_answer_in_valid_json_under_every_method(alias):
    model, tokenizer = load_model(alias)
    decoder = FidesDecoder(model, tokenizer)
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 40}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    results = decoder.generate(
        "In which city is the Eiffel Tower located?",
        ["The Eiffel Tower is a wrought-iron lattice tower in Rome, Italy."],
        methods=["standard", "cad", "adacad", "fides"],
        json_schema=schema,
        max_new_tokens=48,
    )
    for label, result in results.items():
        assert isinstance(valid(result, schema)["answer"], str), label
