"""Which JSON-schema keywords the grammar enforces. llguidance refuses the keywords it knows and does not implement
(`uniqueItems`, `not`, `if`, ...) but passes over unknown ones (`minProperties`, `contentEncoding`, a typo), so an
answer could break them; a strict schema (OpenAI's `strict: true`) must name only keywords that are enforced. A
cycle of references with no content compiles but admits no value: it is refused before compiling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

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


_VALUES = frozenset({"const", "enum", "default", "examples"})
"""Keywords whose values are data, not schemas (a `$ref` key inside them is no reference)."""
_BRANCHES = ("anyOf", "allOf", "oneOf")


def _pointer_part(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _resolve(root: Any, pointer: str) -> Any:
    """The node a local reference's JSON pointer ("", "/$defs/A") names in `root`, or None."""
    node = root
    for token in (pointer.split("/")[1:] if pointer else []):
        part = _pointer_part(token)
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _leads_to(root: Any, node: Any, at: str) -> str | None:
    """Where a schema with no content of its own leads (its local `$ref`'s target, or its one anyOf/allOf/oneOf
    branch), as a JSON pointer; None for a schema with content (or a reference the grammar library resolves)."""
    if not isinstance(node, Mapping):
        return None
    keys = [k for k in node if k not in ANNOTATIONS and k not in ("$defs", "definitions")]
    if keys == ["$ref"] and isinstance(node["$ref"], str) and node["$ref"].startswith("#"):
        pointer = unquote(node["$ref"][1:])
        return pointer if _resolve(root, pointer) is not None else None
    if len(keys) == 1 and keys[0] in _BRANCHES and isinstance(node[keys[0]], list) and len(node[keys[0]]) == 1:
        return f"{at}/{keys[0]}/0"
    return None


def _schemas(node: Any, at: str = "") -> list[tuple[str, Any]]:
    """Every object in `node` that may be a schema, with its JSON pointer (values of const, enum, ... left out)."""
    found, stack = [], [(at, node)]
    while stack:
        here, item = stack.pop()
        if isinstance(item, Mapping):
            found.append((here, item))
            stack.extend((f"{here}/{str(k).replace('~', '~0').replace('/', '~1')}", v) for k, v in reversed(item.items()) if k not in _VALUES)
        elif isinstance(item, list):
            stack.extend((f"{here}/{i}", v) for i, v in reversed(list(enumerate(item))))
    return found


def check_reference_cycles(schema: Any) -> None:
    """A ValueError naming where a `$ref` leads into a cycle of references with no content (`{"$defs": {"A": {"$ref":
    "#/$defs/A"}}, "$ref": "#/$defs/A"}`, or through one-branch anyOf/allOf/oneOf): no value matches such a schema."""
    fine: set[str] = set()
    for at, node in _schemas(schema):
        chain, seen, here = [at], {at}, node
        while True:
            step = _leads_to(schema, here, chain[-1])
            if step is None or step in fine:
                fine.update(chain)
                break
            if step in seen:
                cycle = chain[chain.index(step):] + [step]
                raise ValueError(f"the schema at {at or '/'} leads into a reference cycle with no content "
                                 f"({' -> '.join('#' + p for p in cycle)}): no value can match it; give a schema in the "
                                 "cycle a type, properties or another keyword")
            chain.append(step)
            seen.add(step)
            here = _resolve(schema, step)
