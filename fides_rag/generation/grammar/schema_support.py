"""Which JSON-schema keywords the grammar enforces. llguidance refuses the keywords it knows and does not implement
(`uniqueItems`, `not`, `if`, ...) but passes over unknown ones (`minProperties`, `contentEncoding`, a typo), so an
answer could break them; a strict schema (OpenAI's `strict: true`) must name only keywords that are enforced. A
cycle of references with no content compiles but admits no value: it is refused before compiling."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

ENFORCED = frozenset(
    {
        "type",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "properties",
        "additionalProperties",
        "required",
        "minProperties",
        "maxProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    }
)
"""Keywords llguidance turns into grammar (its JSON-schema documentation's list)."""
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "x-guidance",
    }
)
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
            f"(enforced: {', '.join(sorted(ENFORCED))}); remove them or set strict to false"
        )


_VALUES = frozenset({"const", "enum", "default", "examples"})
"""Keywords whose values are data, not schemas (a `$ref` key inside them is no reference)."""
_BRANCHES = ("anyOf", "allOf", "oneOf")


def _pointer_part(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _resolve(root: Any, pointer: str) -> Any:
    """The node a local reference's JSON pointer ("", "/$defs/A") names in `root`, or None."""
    node = root
    for token in pointer.split("/")[1:] if pointer else []:
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
            stack.extend(
                (f"{here}/{str(k).replace('~', '~0').replace('/', '~1')}", v)
                for k, v in reversed(list(item.items()))
                if k not in _VALUES
            )
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
                cycle = chain[chain.index(step) :] + [step]
                raise ValueError(
                    f"the schema at {at or '/'} leads into a reference cycle with no content "
                    f"({' -> '.join('#' + p for p in cycle)}): no value can match it; give a schema in the "
                    "cycle a type, properties or another keyword"
                )
            chain.append(step)
            seen.add(step)
            here = _resolve(schema, step)


MAX_PROPERTIES = 1000
"""Properties one object of a schema may list: far more than any tool or answer needs, and compiled in well under a
second (10,000 take llguidance about 10 s, and it cannot decode an object with more than about 500 optional ones)."""
MAX_REPEAT = 10_000
"""The largest repetition count (`a{n}`, `a{n,m}`) a pattern may hold: larger ones pass the grammar library's
lexer limits, and no answer within a context window holds them."""
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


def largest_repeat(pattern: str) -> int:
    """The largest repetition count in a regular expression (0 without one)."""
    return max((max(int(a), int(b or 0)) for a, b in _REPEAT.findall(pattern)), default=0)


def check_pattern_limits(pattern: str, at: str = "regex") -> None:
    """A ValueError naming `at` when the pattern repeats something more than MAX_REPEAT times."""
    count = largest_repeat(pattern)
    if count > MAX_REPEAT:
        raise ValueError(
            f"the pattern at {at} repeats {count} times, more than the grammar's limit of {MAX_REPEAT}; use a shorter "
            "repetition or a maxLength"
        )


def _is_object(node: Mapping) -> bool:
    kind = node.get("type")
    return (
        kind == "object"
        or (isinstance(kind, list) and kind == ["object"])
        or (kind is None and ("properties" in node or "required" in node))
    )


def _finite(root: Any, node: Any, at: str, known: dict[str, bool], why: list[str] | None = None) -> bool:
    """Whether `node` has a finite value, given what `known` says of the references it reaches; with `why`, the
    pointer it needs that has none is appended (the first one)."""

    def needs(sub: Any, where: str) -> bool:
        if _finite(root, sub, where, known):
            return True
        if why is not None:
            why.append(where)
        return False

    if not isinstance(node, Mapping):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        target = unquote(ref[1:])
        if _resolve(root, target) is not None and not known.get(target, False):
            if why is not None:
                why.append(target)
            return False
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if (
            isinstance(branches, list)
            and branches
            and not any(_finite(root, b, f"{at}/{key}/{i}", known) for i, b in enumerate(branches))
        ):
            if why is not None:
                why.append(f"{at}/{key}/0")
            return False
    branches = node.get("allOf")
    if isinstance(branches, list) and not all(needs(b, f"{at}/allOf/{i}") for i, b in enumerate(branches)):
        return False
    if _is_object(node):
        declared = node.get("properties")
        properties: Mapping[str, Any] = declared if isinstance(declared, Mapping) else {}
        for name in node.get("required") or []:
            if isinstance(name, str) and name in properties and not needs(properties[name], f"{at}/properties/{name}"):
                return False
    kind = node.get("type")
    nonempty_array = (
        (kind == "array" or kind == ["array"]) and isinstance(node.get("minItems"), int) and node["minItems"] > 0
    )
    return not nonempty_array or needs(node.get("items"), f"{at}/items")


def check_finite(schema: Any) -> None:
    """A ValueError naming where a schema requires itself (a required property, an item of a non-empty array, every
    branch) so that no finite JSON value matches it: `{"$defs": {"A": {"type": "object", "properties": {"a": {"$ref":
    "#/$defs/A"}}, "required": ["a"]}}, "$ref": "#/$defs/A"}`."""
    nodes = _schemas(schema)
    known = {at: False for at, _ in nodes}
    changed = True
    while changed:  # the least fixpoint: a schema is finite once what it needs is
        changed = False
        for at, node in nodes:
            if not known[at] and _finite(schema, node, at, known):
                known[at] = changed = True
    if known.get("", True):
        return
    chain, here = [""], schema
    while True:
        why: list[str] = []
        _finite(schema, here, chain[-1], known, why)
        step = why[0] if why else None
        if step is None or step in chain:
            chain.append(step if step is not None else chain[-1])
            break
        chain.append(step)
        here = _resolve(schema, step)
    loop = chain[chain.index(chain[-1]) :]
    raise ValueError(
        "no finite JSON value matches the schema: it requires itself without end "
        f"({' -> '.join('#' + p for p in loop)}, "
        "reached from the root); make a property on this path optional, or give it a branch that ends"
    )


def check_schema_limits(schema: Any) -> None:
    """A ValueError naming where a schema passes the grammar's limits: an object listing more than MAX_PROPERTIES
    properties, a pattern repeating more than MAX_REPEAT times."""
    for at, node in _schemas(schema):
        properties = node.get("properties")
        if isinstance(properties, Mapping) and len(properties) > MAX_PROPERTIES:
            raise ValueError(
                f"the object at {at or '/'} lists {len(properties)} properties, more than the grammar's limit of "
                f"{MAX_PROPERTIES}; split it or use additionalProperties"
            )
        if isinstance(node.get("pattern"), str):
            check_pattern_limits(node["pattern"], f"{at}/pattern")


def check_schema_shape(schema: Any) -> None:
    """Every check before compiling a schema: reference cycles without content, no finite value, the grammar's
    limits. A ValueError names where the schema fails."""
    check_reference_cycles(schema)
    check_schema_limits(schema)
    check_finite(schema)


def largest_object(schema: Any) -> tuple[str, int] | None:
    """Where the object with the most optional properties sits in `schema`, and how many it has (None: no object
    has one): what a parser limit of the grammar library most often points at."""
    found = None
    for at, node in _schemas(schema):
        properties = node.get("properties")
        if isinstance(properties, Mapping) and _is_object(node):
            required = node.get("required") if isinstance(node.get("required"), list) else []
            optional = sum(1 for name in properties if name not in required)
            if optional and (found is None or optional > found[1]):
                found = (at or "/", optional)
    return found
