"""A seeded fuzz of a real server (bounded in count and time; it runs in CI): 1,000 random, mutated and byte-flipped
bodies, the agents' fields (tools, tool_choice, response_format) and their bad forms included, and 300 random JSON
schemas sent as strict response formats under small budgets. Each request gets a 4xx in OpenAI's error shape whose
`param` names the field at fault, or a 200 with a well-formed completion whose structured content parses and
validates against its schema (with jsonschema); never a 5xx, never a request slower than 10 s, and the server answers
/health and a good request afterwards. 300 bodies the server cannot decode (lone surrogates in keys and values, invalid
UTF-8, truncated JSON) each get a 400 in OpenAI's error shape, and a body sent as another content type a 415. Every body
is drawn from its own seed (`_body(i)`, `_schema_case(i)`, `_undecodable(i)`), and a failure prints it, so one case
reruns alone."""

from __future__ import annotations

import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest
import referencing
import regex

SEED = 2026
BODIES = 1000
SCHEMAS = 300
UNDECODABLE = 300
WORKERS = 6
SLOWEST_S = 10.0
"""No single request may take longer (the server answers even a huge schema's refusal well within it)."""
BUDGET_S = 150.0
"""Each fuzz stops sending once this long has passed (a busy CI machine); at least half its cases must be sent."""
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"

EXTREMES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63,
    2**64,
    -(2**63),
    10**400,
    0.0,
    -0.0,
    1e-300,
    1e308,
    -1e308,
    "",
    "12",
    "yes",
    "\u0000",
    "\ud800",
    "<|end|>",
    "x" * 5000,
    [],
    [None],
    {},
    {"a": {}},
    [[[[[]]]]],
    "NaN",
]
FIELDS = [
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "documents",
    "method",
    "fides_config",
    "no_context_path",
    "user",
    "model",
    "prompt",
    "logprobs",
    "top_logprobs",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "unknown_field",
]
ASK = [{"role": "user", "content": "Where is the tower?"}]
DOCS = ["The tower is in Rome."]
GOOD = {"messages": ASK, "documents": DOCS, "max_tokens": 3}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search.",
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
        "parameters": {"type": "object", "properties": {"word": {"enum": ["a", "b"]}}},
        "strict": True,
    },
}
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Rome", "Paris"]}},
    "required": ["city"],
    "additionalProperties": False,
}
BASES: list[dict[str, Any]] = [
    GOOD,
    {"prompt": "Where is the tower?", "documents": DOCS, "max_tokens": 3},
    {**GOOD, "tools": [SEARCH, LOOKUP], "tool_choice": "auto"},
    {
        **GOOD,
        "tools": [SEARCH, LOOKUP],
        "tool_choice": {"type": "function", "function": {"name": "search"}},
        "max_tokens": 40,
    },
    {**GOOD, "tools": [SEARCH, LOOKUP], "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 40},
    {**GOOD, "response_format": {"type": "json_object"}, "max_tokens": 4},
    {
        **GOOD,
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}},
        "max_tokens": 16,
    },
    {
        "messages": [
            *ASK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"k": 2}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "The tower is in Rome."},
        ],
        "tools": [SEARCH],
        "max_tokens": 3,
    },
]
TOOL_CHOICES: list[Any] = [
    "none",
    "auto",
    "required",
    "any",
    {"type": "function"},
    {"type": "function", "function": {"name": "missing"}},
    {"type": "function", "function": {"name": "lookup"}},
    {"function": {"name": "search"}},
    {"type": "tool", "function": {"name": "search"}},
    {"type": "function", "function": {"name": 7}},
]
RESPONSE_FORMATS: list[Any] = [
    {"type": "text"},
    {"type": "json_object"},
    {"type": "json_schema"},
    {"type": "json_schema", "json_schema": {}},
    {"type": "json_schema", "json_schema": {"name": "a"}},
    {"type": "xml"},
    "json",
    {"json_schema": {"name": "a"}},
    {"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}},
    {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "maxLength": 3}, "strict": True}},
    {"type": "json_schema", "json_schema": {"name": "a", "schema": CITY, "strict": "yes"}},
    {"type": "json_object", "json_schema": {"name": "a", "schema": CITY}},
]
VALID: dict[str, list[Any]] = {
    "temperature": [0, 0.7, 2],
    "top_p": [0.5, 1],
    "seed": [0, 7],
    "stop": ["\n", ["a", "b"], []],
    "n": [1],
    "stream": [True, False],
    "stream_options": [{"include_usage": True}],
    "method": ["standard", "cad", "fides", "fides+agree"],
    "no_context_path": ["question"],
    "user": ["u"],
    "model": ["tiny"],
    "fides_config": [{}],
    "logprobs": [True],
    "top_logprobs": [0, 2],
    "frequency_penalty": [0],
    "presence_penalty": [0],
    "logit_bias": [{}],
    "parallel_tool_calls": [True, False],
    "documents": [[], ["Rome.", "Paris."]],
    "max_completion_tokens": [1, 2],
    "tool_choice": ["none", "auto"],
    "response_format": [{"type": "text"}, {"type": "json_object"}],
}
"""Values each field takes in a valid body: a benign mutation keeps the body valid (mostly), so answers get checked
too."""
NESTED = [
    "tools.0.function.parameters",
    "tools.0.function.name",
    "tools.0.function.strict",
    "tools.0.type",
    "tools.1",
    "tools.0.function",
    "tool_choice.function.name",
    "tool_choice.type",
    "response_format.type",
    "response_format.json_schema",
    "response_format.json_schema.schema",
    "response_format.json_schema.strict",
    "response_format.json_schema.name",
    "messages.0.content",
    "messages.0.role",
    "messages.1.tool_calls.0.function.arguments",
    "stream_options.include_usage",
]


# ----------------------------------------------------------------------------------------------------------------
# Random JSON schemas


PATTERNS = [
    "^[a-z]+$",
    "^\\d{3}-\\d{2}$",
    "[A-Z]",
    "^(yes|no)$",
    "^a{2,5}$",
    "^$",
    "^[0-9a-f]{8}$",
    "x",
    "^\\w+@\\w+\\.com$",
    "(",
    "[",
    "^\\p{L}+$",
    "^a{20000}$",
    "^(a|b)*c$",
    "^.{3}$",
    '^[^"\\\\]*$',
]
FORMATS = [
    "date-time",
    "date",
    "time",
    "email",
    "uuid",
    "ipv4",
    "ipv6",
    "hostname",
    "uri",
    "duration",
    "unknown-format",
]
NAMES = [
    "a",
    "b",
    "name",
    "id",
    "x y",
    "",
    "\u043a\u043b\u044e\u0447",
    '"q"',
    "a/b",
    "$ref",
    "enum",
    "properties",
    "ok",
    "n1",
]
VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -3,
    7,
    2.5,
    "",
    "a",
    "Rome",
    "\u00e9t\u00e9",
    [],
    [1, "a"],
    {},
    {"k": [None]},
]


def _value(rng: random.Random) -> Any:
    return rng.choice(VALUES)


def _string(rng: random.Random) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if rng.random() < 0.4:
        schema["minLength"] = rng.choice([0, 1, 2, 5, 30, 300])
    if rng.random() < 0.4:
        schema["maxLength"] = rng.choice([0, 1, 3, 8, 100])
    if rng.random() < 0.25:
        schema["pattern"] = rng.choice(PATTERNS)
    elif rng.random() < 0.2:
        schema["format"] = rng.choice(FORMATS)
    return schema


def _number(rng: random.Random) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": rng.choice(["integer", "number"])}
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if rng.random() < 0.25:
            schema[key] = rng.choice([-10, 0, 1, 3, 0.5, 2.25, 100, 10**12, -1e300])
    if rng.random() < 0.15:
        schema["multipleOf"] = rng.choice([1, 2, 5, 0.5, 0.25])  # binary fractions: jsonschema checks them exactly
    return schema


def _object(rng: random.Random, depth: int, defs: list[str]) -> dict[str, Any]:
    names = list(dict.fromkeys(rng.choice(NAMES) for _ in range(rng.randint(0, 5))))
    schema: dict[str, Any] = {"type": "object", "properties": {n: _schema(rng, depth - 1, defs) for n in names}}
    if rng.random() < 0.7:
        schema["required"] = [n for n in names if rng.random() < 0.6] + (["missing"] if rng.random() < 0.05 else [])
    if rng.random() < 0.3:
        schema["additionalProperties"] = rng.choice([False, True, {"type": "integer"}])
    if rng.random() < 0.1:
        schema[rng.choice(["minProperties", "maxProperties"])] = rng.choice([0, 1, 2, 9])
    if rng.random() < 0.1:
        del schema["type"]
    return schema


def _array(rng: random.Random, depth: int, defs: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    if rng.random() < 0.85:
        schema["items"] = _schema(rng, depth - 1, defs)
    if rng.random() < 0.15:
        schema["prefixItems"] = [_schema(rng, depth - 1, defs) for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.4:
        schema["minItems"] = rng.choice([0, 1, 2, 4, 40])
    if rng.random() < 0.3:
        schema["maxItems"] = rng.choice([0, 1, 3])
    return schema


def _schema(rng: random.Random, depth: int, defs: list[str]) -> Any:
    """One random schema, nesting at most `depth` more levels; `defs` are the names a `$ref` may point to."""
    kinds = ["string", "number", "boolean", "null", "enum", "const", "empty", "types"]
    if depth > 0:
        kinds += ["object", "object", "array", "array", "anyOf", "oneOf", "allOf"]
    if defs:
        kinds += ["ref"]
    kind = rng.choice(kinds)
    if kind == "string":
        return _string(rng)
    if kind == "number":
        return _number(rng)
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": [_value(rng) for _ in range(rng.randint(0, 4))]}
    if kind == "const":
        return {"const": _value(rng)}
    if kind == "empty":
        return rng.choice([{}, {"description": "anything"}, True])
    if kind == "types":
        return {
            "type": rng.sample(["string", "integer", "number", "boolean", "null", "object", "array"], rng.randint(0, 3))
        }
    if kind == "object":
        return _object(rng, depth, defs)
    if kind == "array":
        return _array(rng, depth, defs)
    if kind == "ref":
        return {"$ref": f"#/$defs/{rng.choice(defs)}"}
    return {kind: [_schema(rng, depth - 1, defs) for _ in range(rng.randint(0, 3))]}


def _special(rng: random.Random) -> Any:
    """A schema at an edge: unsatisfiable, recursive, or huge."""
    node = {
        "type": "object",
        "properties": {"value": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
        "required": ["value"],
    }
    deep: Any = {"type": "integer"}
    for _ in range(rng.choice([10, 40])):
        deep = {"type": "array", "items": deep}
    return rng.choice(
        [
            {},
            {"type": "object"},
            {"enum": []},
            {"anyOf": []},
            {"oneOf": []},
            {"allOf": []},
            {"type": []},
            {"not": {}},
            {"const": None},
            {"type": "string", "minLength": 5, "maxLength": 2},
            {"type": "integer", "minimum": 10, "maximum": 1},
            {"type": "integer", "minimum": 0.2, "maximum": 0.8},
            {"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2},
            {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1},
            {"allOf": [{"type": "string"}, {"type": "integer"}]},
            {"type": "object", "required": ["a"]},
            {"type": "object", "properties": {}, "minProperties": 1},
            {"type": "array", "minItems": 3, "maxItems": 1},
            {"type": "array", "items": False, "minItems": 1},
            {"enum": [{"a": [1, {"b": None}]}, "x"]},
            {"type": "string", "minLength": 60},
            {"type": "array", "minItems": 30, "items": {"type": "integer"}},
            {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1200)}},
            {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(rng.choice([80, 300]))}},
            {"enum": [f"value-{i}" for i in range(3000)]},
            {"type": "string", "pattern": "^a{5000}$"},
            deep,
            {"$ref": "#/$defs/missing"},
            {"$ref": "http://example.com/schema.json"},
            {"$ref": "#"},
            {"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"},
            {"$defs": {"node": node}, "$ref": "#/$defs/node"},
            {"$defs": {"node": {**node, "required": ["value", "next"]}}, "$ref": "#/$defs/node"},
            {
                "$defs": {
                    "tree": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/$defs/tree"}}]}
                },
                "$ref": "#/$defs/tree",
            },
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": ["a"],
                "additionalProperties": {"type": "integer"},
            },
            {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]},
            {"oneOf": [{"type": "integer"}, {"type": "number"}]},
            {"type": "string", "format": "date-time"},
            {"type": "string", "description": "d" * 20000},
        ]
    )


def _schema_case(i: int) -> tuple[Any, int, bool]:
    """The i-th schema case: a schema, its max_tokens (1..64) and whether it is streamed."""
    rng = random.Random(f"{SEED}:schema:{i}")
    if rng.random() < 0.25:
        schema = _special(rng)
    else:
        defs = [f"d{k}" for k in range(rng.randint(0, 2))]
        schema = _schema(rng, rng.randint(0, 3), defs)
        if defs and isinstance(schema, dict):
            schema = {**schema, "$defs": {name: _schema(rng, 2, defs) for name in defs}}
    return schema, rng.randint(1, 64), rng.random() < 0.2


# ----------------------------------------------------------------------------------------------------------------
# Random bodies


def _field_value(rng: random.Random, field: str) -> Any:
    if field == "tools" and rng.random() < 0.7:
        tool = {
            "type": "function",
            "function": {
                "name": rng.choice(["f", "search", "bad name!", "x" * 65, ""]),
                "parameters": rng.choice([_schema(rng, 2, []), {"type": "object"}, [], "x", None]),
            },
        }
        if rng.random() < 0.3:
            tool["function"]["strict"] = rng.choice([True, False, "yes"])
        return rng.choice(
            [[tool], [tool, tool], [SEARCH, tool], [], [{"type": "function"}], [{"type": "retrieval"}], tool]
        )
    if field == "tool_choice" and rng.random() < 0.7:
        return rng.choice(TOOL_CHOICES)
    if field == "response_format" and rng.random() < 0.7:
        if rng.random() < 0.4:
            return {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": _schema(rng, 2, []), "strict": rng.choice([True, False, None])},
            }
        return rng.choice(RESPONSE_FORMATS)
    return rng.choice(EXTREMES)


def _set(body: dict[str, Any], path: str, value: Any) -> None:
    """Set `path` (tools.0.function.name) in `body` where it leads through existing objects and lists."""
    *parents, last = path.split(".")
    node: Any = body
    for part in parents:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return
    if isinstance(node, dict):
        node[last] = value
    elif isinstance(node, list) and last.isdigit() and int(last) <= len(node):
        node[int(last) : int(last) + 1] = [value]


def _body(i: int) -> bytes:
    """The i-th body: random from scratch, a mutated good body, or either with its bytes broken."""
    rng = random.Random(f"{SEED}:body:{i}")
    body: Any
    if rng.random() < 0.15:
        body = {rng.choice(FIELDS): _field_value(rng, "") for _ in range(rng.randint(0, 6))}
        if rng.random() < 0.5:
            body["messages"] = ASK
    else:
        body = json.loads(json.dumps(rng.choice(BASES)))
        for _ in range(rng.randint(1, 3)):
            if not isinstance(body, dict):
                break
            kind = rng.random()
            if kind < 0.3:
                field = rng.choice(sorted(VALID))
                body[field] = rng.choice(VALID[field])
            elif kind < 0.5:
                field = rng.choice(FIELDS)
                body[field] = _field_value(rng, field)
            elif kind < 0.65:
                path = rng.choice(NESTED)
                _set(body, path, _field_value(rng, path.split(".")[0]) if rng.random() < 0.6 else rng.choice(EXTREMES))
            elif kind < 0.8:
                message = {
                    "role": rng.choice(["user", "assistant", "system", "tool", "developer", "robot", 7]),
                    "content": rng.choice(EXTREMES + ["fine", [{"type": "text", "text": "hi"}], [{"type": "image"}]]),
                }
                if rng.random() < 0.3:
                    message["tool_calls"] = [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": rng.choice(["{}", "[1]", "{", "7"])},
                        }
                    ]
                earlier = body.get("messages") if isinstance(body.get("messages"), list) else []
                body["messages"] = [*earlier, message] if rng.random() < 0.7 else [message]
            elif kind < 0.93:
                body.pop(rng.choice(FIELDS), None)
            else:
                body = rng.choice(EXTREMES)
    if isinstance(body, dict):
        for field in ("max_tokens", "max_completion_tokens"):
            value = body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and 4 < value < 2**20:
                # a valid budget stays short (a forced call or a schema answer may take a few more); the extremes past
                # the window are refused before decoding
                body[field] = (
                    rng.randint(1, 48) if "tool_choice" in body or "response_format" in body else rng.randint(1, 4)
                )
    text = json.dumps(body, allow_nan=True)
    if rng.random() < 0.15:  # broken bytes: a random byte flipped, then cut where it stands or later
        raw = bytearray(text.encode("utf-8", "surrogatepass"))
        at = rng.randrange(len(raw))
        raw[at] = rng.randrange(256)
        return bytes(raw[: rng.randint(at, len(raw))])
    return text.encode("utf-8", "surrogatepass")


LONE_SURROGATES = ["\\ud800", "\\udc80", "\\udfff", "\\ud83d", "a\\udc80b", "\\ude00\\ud83d", "\\udbff\\udbff"]
"""JSON escapes of UTF-16 code units that stand alone (no character): valid JSON, no text."""
INVALID_UTF8 = [
    b"\xff",
    b"\xfe",
    b"\x80",
    b"\xc3\x28",
    b"\xc0\xaf",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xed\xb2\x80",
    b"\xf4\x90\x80\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xe0\x80\xaf",
]
"""Bytes no UTF-8 decoder accepts: stray continuation bytes, overlong forms, encoded surrogates, past U+10FFFF."""
OTHER_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/xml",
    "",
    "application/jsonx",
    "text/json",
]


def _undecodable(i: int) -> tuple[bytes, str, int]:
    """The i-th body the server cannot decode: (its bytes, its Content-Type, the status it must get)."""
    rng = random.Random(f"{SEED}:undecodable:{i}")
    text = json.dumps(rng.choice(BASES))
    kind = rng.choice(["surrogate key", "surrogate value", "invalid utf-8", "truncated", "content type"])
    if kind == "surrogate key":  # a new key at the start of a random object
        at = rng.choice([m.end() for m in re.finditer(r"\{(?=\")", text)])
        text = f'{text[:at]}"{rng.choice(LONE_SURROGATES)}": {rng.choice(["1", "null", json.dumps(ASK)])}, {text[at:]}'
    elif kind == "surrogate value":  # inside a random string value
        at = rng.choice([m.end() for m in re.finditer(r': "', text)])
        text = text[:at] + rng.choice(LONE_SURROGATES) + text[at:]
    elif kind == "invalid utf-8":
        raw = text.encode()
        at = rng.randrange(len(raw) + 1)
        return raw[:at] + rng.choice(INVALID_UTF8) + raw[at:], "application/json", 400
    elif kind == "truncated":
        return text.encode()[: rng.randrange(len(text))], "application/json", 400
    else:
        return text.encode(), rng.choice(OTHER_TYPES), 415
    return text.encode(), "application/json", 400


# ----------------------------------------------------------------------------------------------------------------
# Checking the answers


TIME = r"(\d\d):(\d\d):(\d\d)(\.\d+)?([Zz]|[+-](\d\d):(\d\d))"
DATE_TIME, PARTIAL_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[Tt]" + TIME), re.compile(TIME)


def _time(match: re.Match, at: int) -> bool:
    hour, minute, second = (int(match.group(at + i)) for i in range(3))
    offset = (0, 0) if match.group(at + 5) is None else (int(match.group(at + 5)), int(match.group(at + 6)))
    return hour < 24 and minute < 60 and second <= 60 and offset[0] < 24 and offset[1] < 60  # 60: a leap second


def _date_time(value: object) -> bool:
    """RFC 3339's date-time, year 0000 and leap seconds included (jsonschema checks it only with an optional
    package)."""
    match = DATE_TIME.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return not isinstance(value, str)
    year, month, day = (int(match.group(i)) for i in range(1, 4))
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    return 1 <= month <= 12 and 1 <= day <= days[month - 1] and _time(match, 4)


def _partial_time(value: object) -> bool:
    """RFC 3339's full-time (the schema format "time")."""
    match = PARTIAL_TIME.fullmatch(value) if isinstance(value, str) else None
    return not isinstance(value, str) if match is None else _time(match, 1)


FORMAT_CHECKER = jsonschema.FormatChecker(formats=())
FORMAT_CHECKER.checkers = {
    **jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers,
    "date-time": (_date_time, ()),
    "time": (_partial_time, ()),
}
"""Draft 2020-12's format checks, with date-time and time (whose checks need an optional package) checked here."""
NO_REMOTE = referencing.Registry()
"""No `$ref` is fetched over the network while validating: a remote one is unresolvable."""


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not regex.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


VALIDATOR = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})
"""Draft 2020-12 with patterns in the `regex` module's dialect, which has the classes (\\p{L}) that `re` lacks."""


def _invalid(instance: Any, schema: Any) -> str | None:
    """Why `instance` does not validate against `schema`, or None."""
    try:
        error = jsonschema.exceptions.best_match(
            VALIDATOR(schema, format_checker=FORMAT_CHECKER, registry=NO_REMOTE).iter_errors(instance)
        )
    except Exception as err:  # a schema the validator cannot evaluate, though the server took it
        return f"the validator cannot evaluate the schema: {type(err).__name__}: {err}"
    return None if error is None else f"{error.message} at {list(error.absolute_path)}"


def _events(text: str) -> tuple[list[dict[str, Any]], str | None]:
    """A stream's JSON events, or the reason it is broken."""
    frames = [f for f in text.split("\n\n") if f.strip()]
    if not frames or frames[-1] != "data: [DONE]":
        return [], f"the stream does not end with data: [DONE]: {text[-200:]!r}"
    events = []
    for frame in frames[:-1]:
        if not frame.startswith("data: "):
            return [], f"a frame that is not an event: {frame[:200]!r}"
        event = json.loads(frame[6:])
        if "error" in event:
            return [], f"the stream failed: {event['error']}"
        events.append(event)
    return events, None


def _structure(request: dict[str, Any]) -> tuple[str, Any] | None:
    """What a valid request's answer is held to: ("content", schema) or ("tool_calls", {name: parameters})."""
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return "content", {"type": "object"}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        return "content", {"type": "object"} if schema is None else schema
    choice, tools = request.get("tool_choice"), request.get("tools") or []
    if choice == "required" or isinstance(choice, dict):
        return "tool_calls", {
            t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools
        }
    return None


def _answer_problem(request: dict[str, Any], path: str, response: httpx.Response) -> str | None:
    """Why a 200 is not a well-formed completion (or its structured answer does not validate), or None."""
    chat = path == CHAT
    if request.get("stream") is True:
        events, broken = _events(response.text)
        if broken:
            return broken
        kind = "chat.completion.chunk" if chat else "text_completion"
        if any(e.get("object") != kind for e in events):
            return f"a chunk that is not a {kind}"
        choices = [e["choices"][0] for e in events if e.get("choices")]
        finishes = [c["finish_reason"] for c in choices if c.get("finish_reason")]
        if len(finishes) != 1:
            return f"{len(finishes)} finish reasons in the stream"
        content = "".join((c.get("delta", {}).get("content") or "") if chat else c.get("text", "") for c in choices)
        calls: dict[int, dict[str, str]] = {}
        for c in choices:
            for d in c.get("delta", {}).get("tool_calls") or []:
                call = calls.setdefault(d["index"], {"name": "", "arguments": ""})
                call["name"] += (d.get("function") or {}).get("name") or ""
                call["arguments"] += (d.get("function") or {}).get("arguments") or ""
        tool_calls, finish = list(calls.values()), finishes[0]
    else:
        answer = response.json()
        if (
            answer.get("object") != ("chat.completion" if chat else "text_completion")
            or len(answer.get("choices") or []) != 1
        ):
            return f"not a completion: {str(answer)[:300]}"
        usage = answer.get("usage") or {}
        if not all(isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens", "total_tokens")):
            return f"usage without its counts: {usage}"
        choice = answer["choices"][0]
        finish = choice.get("finish_reason")
        if chat:
            message = choice.get("message") or {}
            content, tool_calls = message.get("content"), [c["function"] for c in message.get("tool_calls") or []]
            if (
                message.get("role") != "assistant"
                or (content is None and not tool_calls)
                or not isinstance(content, (str, type(None)))
            ):
                return f"not an assistant message: {message}"
        else:
            content, tool_calls = choice.get("text"), []
            if not isinstance(content, str):
                return f"no text: {choice}"
    if finish not in ("stop", "length", "tool_calls"):
        return f"finish_reason {finish!r}"
    structure = _structure(request) if chat else None
    if structure is None:
        return None
    where, schema = structure
    if where == "content":
        try:
            value = json.loads(content or "")
        except ValueError:
            return f"the content is not JSON (finish_reason {finish}): {content!r}"
        invalid = _invalid(value, schema)
        return (
            None
            if invalid is None
            else f"the content {content!r} does not validate (finish_reason {finish}): {invalid}"
        )
    if not tool_calls or finish != "tool_calls":
        return f"a forced call answered without one (finish_reason {finish}): {content!r}"
    for call in tool_calls:
        if call["name"] not in schema:
            return f"a call of an unknown tool: {call}"
        try:
            arguments = json.loads(call["arguments"])
        except ValueError:
            return f"arguments that are not JSON: {call}"
        invalid = _invalid(arguments, schema[call["name"]])
        if invalid is not None:
            return f"a call's arguments do not validate: {call}: {invalid}"
    return None


def _error_problem(request: Any, response: httpx.Response, params: tuple[str, ...] | None = None) -> str | None:
    """Why a 4xx is not in OpenAI's error shape, or (for a body that is a JSON object) names no field it holds or
    should hold; `params`: the prefixes its param may have."""
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"not OpenAI's error shape: {response.text[:300]!r}"
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
        return f"not OpenAI's error shape: {error}"
    if not isinstance(error["message"], str) or not error["message"] or not isinstance(error["type"], str):
        return f"an error without its message or type: {error}"
    if response.status_code != 400 or not isinstance(request, dict):
        return None
    param = error["param"]
    if not isinstance(param, str) or not param:
        return f"a 400 naming no field: {error}"
    first = param.split(".")[0]
    if params is not None and not param.startswith(params):
        return f"a 400 naming {param!r}, not one of {params}: {error}"
    if first not in request and first not in ("messages", "prompt", "max_tokens", "max_completion_tokens"):
        return f"a 400 naming {param!r}, which the body does not hold: {error}"
    return None


def _post(
    server, path: str, raw: bytes, content_type: str = "application/json"
) -> tuple[httpx.Response | None, float, str | None]:
    started = time.monotonic()
    headers = {"Content-Type": content_type} if content_type else {}
    try:
        response = httpx.post(f"{server.url}{path}", content=raw, headers=headers, timeout=60)
    except httpx.HTTPError as err:
        return None, time.monotonic() - started, f"no answer: {type(err).__name__}: {err}"
    return response, time.monotonic() - started, None


def _check(
    server, path: str, raw: bytes, request: Any, params: tuple[str, ...] | None = None
) -> tuple[int, str | None, str]:
    """(status, problem or None, the error's message) of one request."""
    response, elapsed, failed = _post(server, path, raw)
    if response is None:
        return 0, failed, ""
    status = response.status_code
    if elapsed > SLOWEST_S:
        return status, f"took {elapsed:.1f} s", ""
    if status >= 500:
        return status, f"a {status}: {response.text[:300]!r}", ""
    if status >= 400:
        problem = _error_problem(request, response, params)
        return status, problem, "" if problem else response.json()["error"]["message"]
    if status != 200:
        return status, f"status {status}", ""
    return status, _answer_problem(request, path, response), ""


def _parsed(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _still_healthy(server) -> None:
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    good = httpx.post(f"{server.url}{CHAT}", json=GOOD, timeout=60)
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] is not None, good.text[:300]


def _run(cases: list[Any], one) -> list[tuple[int, str | None]]:
    """Each case through `one` on WORKERS threads; cases left when BUDGET_S has passed are skipped (status -1)."""
    deadline = time.monotonic() + BUDGET_S

    def bounded(case: Any) -> tuple[int, str | None]:
        return (-1, None) if time.monotonic() > deadline else one(case)

    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(bounded, cases))


def test_random_mutated_and_broken_bodies_get_a_4xx_naming_their_field_or_a_valid_answer(server):
    def one(i: int) -> tuple[int, str | None]:
        raw = _body(i)
        request = _parsed(raw)
        path = COMPLETIONS if isinstance(request, dict) and "prompt" in request else CHAT
        return _check(server, path, raw, request)[:2]

    outcomes = _run(list(range(BODIES)), one)
    failures = [
        f"body {i} ({status}): {problem}\n    {_body(i)[:400]!r}"
        for i, (status, problem) in enumerate(outcomes)
        if problem
    ]
    assert not failures, f"{len(failures)} failures; rerun one with _body(i):\n" + "\n".join(failures[:8])
    statuses = [status for status, _ in outcomes if status != -1]
    assert len(statuses) >= BODIES // 2 and {200, 400} <= set(statuses), sorted(set(statuses))
    _still_healthy(server)


def _schema_body(schema: Any, budget: int, stream: bool) -> dict[str, Any]:
    return {
        "messages": ASK,
        "max_tokens": budget,
        "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "fuzz", "schema": schema, "strict": True}},
    }


MINIMUM = re.compile(r"set max_tokens to at least (\d+)")


def test_random_schemas_under_small_budgets_get_a_valid_answer_or_a_4xx_naming_the_schema_or_budget(server):
    params = ("response_format", "max_tokens")

    def one(i: int) -> tuple[int, str | None]:
        schema, budget, stream = _schema_case(i)
        body = _schema_body(schema, budget, stream)
        status, problem, message = _check(server, CHAT, json.dumps(body).encode(), body, params)
        minimum = MINIMUM.search(message)
        if problem or minimum is None or int(minimum.group(1)) > 256:
            return status, problem
        # refused as below the shortest answer: the minimum it names must be enough
        body = _schema_body(schema, int(minimum.group(1)), stream)
        status, problem, _ = _check(server, CHAT, json.dumps(body).encode(), body, params)
        return status, (
            f"at the minimum it named, {body['max_tokens']}: {problem}"
            if problem
            else None
            if status == 200
            else f"at the minimum it named, {body['max_tokens']}: a {status}"
        )

    outcomes = _run(list(range(SCHEMAS)), one)
    failures = [
        f"schema {i} ({status}): {problem}\n    {json.dumps(_schema_case(i))[:600]}"
        for i, (status, problem) in enumerate(outcomes)
        if problem
    ]
    assert not failures, f"{len(failures)} failures; rerun one with _schema_case(i):\n" + "\n".join(failures[:8])
    statuses = [status for status, _ in outcomes if status != -1]
    assert len(statuses) >= SCHEMAS // 2 and {200, 400} <= set(statuses), sorted(set(statuses))
    _still_healthy(server)


def test_bodies_the_server_cannot_decode_get_a_400_in_openais_error_shape(server):
    def one(i: int) -> tuple[int, str | None]:
        raw, content_type, expected = _undecodable(i)
        response, _, failed = _post(server, COMPLETIONS if i % 4 == 0 else CHAT, raw, content_type)
        if response is None:
            return 0, failed
        if response.status_code != expected:
            return response.status_code, f"a {response.status_code}, not a {expected}: {response.text[:300]!r}"
        return expected, _error_problem(None, response)

    outcomes = _run(list(range(UNDECODABLE)), one)
    failures = [
        f"body {i} ({status}): {problem}\n    {_undecodable(i)!r:.400}"
        for i, (status, problem) in enumerate(outcomes)
        if problem
    ]
    assert not failures, f"{len(failures)} failures; rerun one with _undecodable(i):\n" + "\n".join(failures[:8])
    assert {status for status, _ in outcomes if status != -1} == {400, 415}
    _still_healthy(server)


@pytest.fixture(scope="module")
def server(tiny_model_dir, start_server_module):
    return start_server_module(tiny_model_dir, "--max-new-tokens", "3")
