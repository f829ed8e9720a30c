"""Structured output constraints, checked before anything decodes; bad schemas name their field."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from fides_rag.calls import CallInputError, IncompleteAnswerError, constraint_of, parse_structure, refuse_other_grammar, with_structure

pytest.importorskip("llguidance")


class City(BaseModel):
    name: str


def test_a_pydantic_class_or_a_dict_becomes_a_closed_schema():
    schema = constraint_of(json_schema=City)["json_schema"]
    assert schema["additionalProperties"] is False and schema["properties"]["name"]["type"] == "string"
    assert constraint_of(json_schema={"type": "object"}, strict=False) == {"json_schema": {"type": "object"}}
    assert constraint_of(regex="[0-9]+") == {"regex": "[0-9]+"} and constraint_of() == {}


@pytest.mark.parametrize("schema, problem", [
    ({"type": "object", "properties": {"a": {"type": "strin"}}}, "Invalid type"),
    ({"type": "object", "if": {"type": "object"}, "then": {}}, "Unimplemented keys"),
    ({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}, "Unknown format"),
])
def test_a_schema_the_grammar_library_cannot_compile_names_the_field(schema, problem):
    with pytest.raises(CallInputError, match=problem) as err:
        constraint_of(json_schema=schema, field="response_format.json_schema.schema")
    assert err.value.field == "response_format.json_schema.schema"


def test_a_cut_answer_never_parses_as_a_partial_object():
    assert parse_structure('{"name": "Rome"}', "eos", City) == City(name="Rome")
    with pytest.raises(IncompleteAnswerError, match="cut at max_new_tokens"):
        parse_structure('{"name": "Ro', "length", City)


def test_a_structured_call_decodes_under_its_schema_and_refuses_a_second_grammar():
    call = with_structure({"method": "fides", "max_new_tokens": 8}, City, "structured_predict")
    assert call["method"] == "fides" and call["json_schema"]["additionalProperties"] is False
    with pytest.raises(CallInputError, match="structured_predict holds the answer to its JSON schema; drop regex=") as err:
        with_structure({"regex": "a+"}, City, "structured_predict")
    assert err.value.field == "regex"


def test_a_second_grammar_is_refused_naming_every_one_given():
    refuse_other_grammar({"method": "fides", "regex": None}, "held to a schema")  # nothing given: nothing refused
    with pytest.raises(CallInputError, match=r"held to a schema; drop regex, grammar=$") as err:
        refuse_other_grammar({"regex": "a+", "grammar": "g"}, "held to a schema")
    assert err.value.field == "regex"
