"""Structured output constraints, checked before anything decodes; bad schemas name their field."""

from __future__ import annotations

import time

import pytest
from pydantic import BaseModel

from fides_rag.calls import (
    CallInputError,
    IncompleteAnswerError,
    constraint_of,
    parse_structure,
    refuse_other_grammar,
    with_structure,
)

pytest.importorskip("llguidance")


class City(BaseModel):
    name: str


def test_a_pydantic_class_or_a_dict_becomes_a_closed_schema():
    schema = constraint_of(json_schema=City)["json_schema"]
    assert schema["additionalProperties"] is False and schema["properties"]["name"]["type"] == "string"
    assert constraint_of(json_schema={"type": "object"}, strict=False) == {"json_schema": {"type": "object"}}
    assert constraint_of(regex="[0-9]+") == {"regex": "[0-9]+"} and constraint_of() == {}


@pytest.mark.parametrize(
    "schema, problem",
    [
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "Invalid type"),
        ({"type": "object", "if": {"type": "object"}, "then": {}}, "Unimplemented keys"),
        ({"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}, "Unknown format"),
    ],
)
def test_a_schema_the_grammar_library_cannot_compile_names_the_field(schema, problem):
    with pytest.raises(CallInputError, match=problem) as err:
        constraint_of(json_schema=schema, field="response_format.json_schema.schema")
    assert err.value.field == "response_format.json_schema.schema"


@pytest.mark.parametrize(
    "schema, at, cycle",
    [
        ({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, "/", "#/$defs/A -> #/$defs/A"),
        (
            {
                "type": "object",
                "properties": {"x": {"$ref": "#/$defs/A"}},
                "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A", "title": "B"}},
            },
            "/properties/x",
            "#/$defs/A -> #/$defs/B -> #/$defs/A",
        ),
        ({"$ref": "#"}, "/", "# -> #"),
        (
            {"definitions": {"A": {"anyOf": [{"$ref": "#/definitions/A"}]}}, "$ref": "#/definitions/A"},
            "/",
            "#/definitions/A -> #/definitions/A/anyOf/0 -> #/definitions/A",
        ),
    ],
)
def test_a_reference_cycle_with_no_content_is_refused_naming_where_it_is(schema, at, cycle):
    with pytest.raises(CallInputError, match="reference cycle with no content") as err:
        constraint_of(json_schema=schema, field="response_format.json_schema.schema")
    assert (
        err.value.field == "response_format.json_schema.schema"
        and f"at {at} " in str(err.value)
        and cycle in str(err.value)
    )
    assert "does not exist" not in str(err.value)


def test_a_recursive_schema_with_content_is_no_cycle():
    tree = {
        "$defs": {
            "Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
        },
        "$ref": "#/$defs/Node",
    }
    assert constraint_of(json_schema=tree, strict=False) == {"json_schema": tree}
    constraint_of(
        json_schema={"type": "object", "properties": {"a": {"const": {"$ref": "#"}}}}
    )  # a value, not a reference


BIG = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}}
RECURSIVE = {
    "$defs": {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}},
    "$ref": "#/$defs/A",
}


@pytest.mark.parametrize(
    "schema, named",
    [
        (BIG, ["the object at / lists 10000 properties", "limit of 1000"]),
        ({"type": "object", "properties": {"outer": BIG}}, ["the object at /properties/outer lists 10000 properties"]),
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a{1000000}$"}}},
            ["pattern at /properties/a/pattern repeats 1000000 times", "limit of 10000"],
        ),
        (RECURSIVE, ["no finite JSON value", "#/$defs/A -> #/$defs/A/properties/a -> #/$defs/A"]),
        (
            {
                "type": "object",
                "properties": {"xs": {"type": "array", "minItems": 1, "items": {"$ref": "#"}}},
                "required": ["xs"],
            },
            ["no finite JSON value", "# -> #/properties/xs -> #/properties/xs/items -> #"],
        ),
    ],
)
def test_a_schema_past_the_grammars_limits_is_refused_at_once_naming_where_and_the_limit(schema, named):
    started = time.monotonic()
    with pytest.raises(CallInputError) as err:
        constraint_of(json_schema=schema, field="response_format.json_schema.schema")
    assert time.monotonic() - started < 2.0 and err.value.field == "response_format.json_schema.schema"
    for text in named:
        assert text in str(err.value), str(err.value)


def test_recursion_that_can_end_and_repetitions_within_the_limit_are_accepted():
    tree = {
        "$defs": {
            "A": {
                "type": "object",
                "properties": {"a": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}},
                "required": ["a"],
            }
        },
        "$ref": "#/$defs/A",
    }
    optional = {"$defs": {"A": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}}, "$ref": "#/$defs/A"}
    listed = {"type": "object", "properties": {"xs": {"type": "array", "items": {"$ref": "#"}}}, "required": ["xs"]}
    for schema in (
        tree,
        optional,
        listed,
        {"type": "string", "pattern": "^a{10000}$"},
        {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(1000)},
            "required": [f"p{i}" for i in range(1000)],
        },
    ):
        assert constraint_of(json_schema=schema, strict=False) == {"json_schema": schema}


def test_a_cut_answer_never_parses_as_a_partial_object():
    assert parse_structure('{"name": "Rome"}', "eos", City) == City(name="Rome")
    with pytest.raises(IncompleteAnswerError, match="cut at max_new_tokens"):
        parse_structure('{"name": "Ro', "length", City)


def test_a_structured_call_decodes_under_its_schema_and_refuses_a_second_grammar():
    call = with_structure({"method": "fides", "max_new_tokens": 8}, City, "structured_predict")
    assert call["method"] == "fides" and call["json_schema"]["additionalProperties"] is False
    with pytest.raises(
        CallInputError, match="structured_predict holds the answer to its JSON schema; drop regex="
    ) as err:
        with_structure({"regex": "a+"}, City, "structured_predict")
    assert err.value.field == "regex"


def test_a_second_grammar_is_refused_naming_every_one_given():
    refuse_other_grammar({"method": "fides", "regex": None}, "held to a schema")  # nothing given: nothing refused
    with pytest.raises(CallInputError, match=r"held to a schema; drop regex, grammar=$") as err:
        refuse_other_grammar({"regex": "a+", "grammar": "g"}, "held to a schema")
    assert err.value.field == "regex"
