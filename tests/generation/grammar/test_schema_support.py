"""Strict schemas name only keywords the grammar enforces; the others are found wherever they sit."""

from __future__ import annotations

import pytest

from fides_rag.generation.grammar.schema_support import check_strict_schema, unenforced_keywords


def test_annotations_and_enforced_keywords_pass():
    schema = {
        "title": "T",
        "type": "object",
        "description": "d",
        "properties": {"a": {"type": "string", "maxLength": 3, "default": "x"}},
        "required": ["a"],
        "additionalProperties": False,
        "$defs": {"n": {"type": "integer", "minimum": 0}},
    }
    check_strict_schema(schema)
    assert unenforced_keywords(schema) == []


def test_unenforced_keywords_are_found_in_nested_schemas():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string", "contentEncoding": "base64"},
            "b": {"type": "array", "items": {"type": "string", "foo": 1}},
        },
        "anyOf": [{"patternProperties": {}}],
    }
    assert unenforced_keywords(schema) == [
        "/properties/a/contentEncoding",
        "/properties/b/items/foo",
        "/anyOf/0/patternProperties",
    ]
    with pytest.raises(ValueError, match="contentEncoding"):
        check_strict_schema(schema)
