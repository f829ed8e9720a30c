"""Which JSON-schema keywords the grammar enforces. llguidance refuses the keywords it knows and does not implement
(`uniqueItems`, `not`, `if`, ...) but passes over unknown ones (`minProperties`, `contentEncoding`, a typo), so an
answer could break them; a strict schema (OpenAI's `strict: true`) must name only keywords that are enforced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENFORCED = frozenset({
    "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
    "properties", "additionalProperties", "required", "minProperties", "maxProperties",
    "items", "prefixItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
})
"""Keywords llguidance turns into grammar (its JSON-schema documentation's list)."""
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                         "readOnly", "writeOnly", "x-guidance"})
"""Keywords that constrain nothing (and llguidance's own options)."""
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def unenforced_keywords(schema: Any, at: str = "") -> list[str]:
    """Every keyword of `schema` (and its subschemas) that the grammar would not enforce, as JSON pointers."""
    if not isinstance(schema, Mapping):
        return []
    found = [f"{at}/{key}" for key in schema if key not in ENFORCED and key not in ANNOTATIONS]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), Mapping):
            for name, sub in schema[key].items():
                found += unenforced_keywords(sub, f"{at}/{key}/{name}")
    for key in _SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                found += unenforced_keywords(sub, f"{at}/{key}/{i}")
    for key in ("items", "additionalProperties"):
        found += unenforced_keywords(schema.get(key), f"{at}/{key}")
    return found


def check_strict_schema(schema: Any) -> None:
    """A ValueError naming the keywords of a strict schema that the grammar would not enforce."""
    unenforced = unenforced_keywords(schema)
    if unenforced:
        raise ValueError(
            f"strict schemas may use only keywords the grammar enforces; not enforced: {', '.join(unenforced)} "
            f"(enforced: {', '.join(sorted(ENFORCED))}); remove them or set strict to false")
