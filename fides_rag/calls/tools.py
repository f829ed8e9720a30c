"""Tool calling, framework-free: tools go in front of a model (through its chat template when the template renders
`tools=`, else as a fallback system block) and its calls are read back from the text it writes.

The fallback format is Hermes/Qwen's: the tools as JSON lines inside `<tools></tools>`, each call written as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, each result as `<tool_response>...</tool_response>`. With
`tool_choice` "required" (or "any") or a tool's
name, `constraint()` is a JSON schema that admits exactly one valid call as a bare JSON object; pass it as
`json_schema=` to the decoder so a small model cannot write anything else. LangChain's ChatFides, LlamaIndex's
FidesLLM and the server share this module: `tool_choice_name` reads every front door's tool_choice forms,
`ToolSpec.from_any` their tools, `calls_from_openai` the calls an assistant message carries.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fides_rag.calls.structure import check_json_schema, closed_schema
from fides_rag.errors import CallInputError
from fides_rag.prompts.raw import render_chat

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CHOICES = ("auto", "none", "required", "any")
"""tool_choice values other than a tool's name ("any" is "required")."""
ToolChoice = str | bool | Mapping[str, Any] | None
"""Every front door's tool_choice forms, as `tool_choice_name` reads them."""
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_PROBE = "fides_probe_tool_3f9c"
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""OpenAI's rule for a tool's name (matched whole): the name is written into the prompt and matched in the answer."""


def new_call_id() -> str:
    """An OpenAI-style call id, "call_" and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does, and the JSON schema of its arguments object."""

    name: str
    description: str
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise CallInputError(f"a tool needs a non-empty name, got {self.name!r}", "tools.function.name")
        if not TOOL_NAME.fullmatch(self.name):
            raise CallInputError(
                f"tool name {self.name!r} must match ^[a-zA-Z0-9_-]{{1,64}}$ (letters, digits, '_' and '-', at "
                "most 64), "
                "as OpenAI's tool names do",
                "tools.function.name",
            )
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type", "object") != "object":
            raise CallInputError(
                f"tool {self.name!r}: parameters must be a JSON schema of an object, got {self.parameters!r}",
                "tools.function.parameters",
            )
        check_json_schema(
            dict(self.parameters), "tools.function.parameters", what=f"tool {self.name!r}: its parameters"
        )

    def openai(self) -> dict:
        """The tool in OpenAI's shape: {"type": "function", "function": {"name", "description", "parameters"}}."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }

    @classmethod
    def from_openai(cls, tool: Mapping[str, Any]) -> ToolSpec:
        """A ToolSpec from OpenAI's shape ({"type": "function", "function": {...}}) or its inner function dict."""
        function = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        if not isinstance(function, Mapping) or "name" not in function:
            raise ValueError(
                f"not an OpenAI function tool (need {{'type': 'function', 'function': {{'name': ...}}}}): "
                f"{dict(tool)!r}"
            )
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        return cls(function["name"], function.get("description") or "", dict(parameters))

    @classmethod
    def from_any(cls, tool: object) -> ToolSpec:
        """A ToolSpec, an OpenAI tool dict, or an object with `.metadata.to_openai_tool()` (a LlamaIndex tool)."""
        if isinstance(tool, ToolSpec):
            return tool
        if isinstance(tool, Mapping):
            return cls.from_openai(tool)
        metadata = getattr(tool, "metadata", None)
        if metadata is not None and hasattr(metadata, "to_openai_tool"):
            return cls.from_openai(metadata.to_openai_tool(skip_length_check=True))
        raise CallInputError(
            f"tools must be ToolSpecs, OpenAI tool dicts or LlamaIndex tools, got {type(tool).__name__}", "tools"
        )


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool's name, its arguments, and an id ("call_<hex>" when the model gave none)."""

    name: str
    arguments: dict
    id: str = field(default_factory=new_call_id)

    def openai(self) -> dict:
        """The call in OpenAI's shape (arguments as a JSON string)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


def _rebased(schema: object, prefix: str) -> object:
    """`schema` moved under the JSON pointer `prefix` of a larger schema: its local references ("#/$defs/Item",
    "#") rewritten to point where their targets now are (values of const, enum, ... kept as they are)."""
    if isinstance(schema, list):
        return [_rebased(item, prefix) for item in schema]
    if not isinstance(schema, dict):
        return schema
    moved: dict[str, object] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            moved[key] = f"#{prefix}{value[1:]}"
        else:
            moved[key] = value if key in ("const", "enum", "default", "examples") else _rebased(value, prefix)
    return moved


def _call_schema(tool: ToolSpec, at: str = "") -> dict:
    """The schema of one call of `tool`, to sit at the JSON pointer `at` of the forcing schema (its arguments' local
    references rebased there, so a pydantic model's `$defs` still resolve)."""
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.name},
            "arguments": _rebased(closed_schema(dict(tool.parameters)), f"{at}/properties/arguments"),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_choice_name(tool_choice: ToolChoice, names: Sequence[str], *, required: bool = False) -> str:
    """Every front door's tool_choice as one string: None ("required" when `required`, else "auto"), "auto", "none",
    "any"/"required", a tool's name, True (the only tool), False ("none"), or OpenAI's {"type": "function",
    "function": {"name": ...}} (and {"type": "required"}). A ValueError names tool_choice when it fits no tool."""
    if tool_choice is None or tool_choice is False:
        return "none" if tool_choice is False else "required" if required else "auto"
    if tool_choice is True:
        if len(names) != 1:
            raise CallInputError(
                f"tool_choice=True forces the only tool, but {len(names)} tools were given; name one", "tool_choice"
            )
        return names[0]
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
        if not name and tool_choice.get("type") in CHOICES:
            return tool_choice_name(tool_choice["type"], names, required=required)
        if not isinstance(name, str):
            raise CallInputError(
                f"tool_choice dict must name a function ({{'type': 'function', 'function': {{'name': ...}}}}), got "
                f"{dict(tool_choice)!r}",
                "tool_choice",
            )
        if (
            name not in names or name in CHOICES
        ):  # a function's name, never a mode: {"name": "none"} forces no "none" mode
            why = (
                f"which would read as tool_choice={name!r}; rename the tool"
                if name in names
                else f"which is not a bound tool's name ({', '.join(names) or 'no tools'})"
            )
            raise CallInputError(f"tool_choice names the function {name!r}, {why}", "tool_choice")
        return name
    if not isinstance(tool_choice, str):
        raise CallInputError(
            f"tool_choice must be a string, a bool or a dict, got {type(tool_choice).__name__}", "tool_choice"
        )
    if required and tool_choice in ("auto", "none"):
        raise CallInputError(f"tool_required=True contradicts tool_choice={tool_choice!r}", "tool_choice")
    choice = "required" if tool_choice == "any" else tool_choice
    if choice not in CHOICES and choice not in names:
        bound = ", ".join(names) or "no tools"
        raise CallInputError(
            f"tool_choice must be one of {', '.join(CHOICES)} or a tool's name ({bound}); {tool_choice!r} is not "
            f"a bound tool's name ({bound})",
            "tool_choice",
        )
    if choice == "required" and not names:
        raise CallInputError(f"tool_choice={tool_choice!r} needs at least one tool", "tool_choice")
    return choice


def _arguments(value: object) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise CallInputError(
                f"a tool call's arguments must be a JSON object, got {value!r}",
                "messages.tool_calls.function.arguments",
            ) from None
    if not isinstance(value, Mapping):
        raise CallInputError(
            f"a tool call's arguments must be a JSON object, got {value!r}", "messages.tool_calls.function.arguments"
        )
    return dict(value)


def calls_from_openai(items: Sequence[Any]) -> list[ToolCall]:
    """An assistant message's earlier calls in OpenAI's shape ({"id", "function": {"name", "arguments"}}, arguments
    as JSON text or a dict; dicts or objects with those attributes, as Ollama's and LangChain's are)."""
    calls = []
    for item in items or []:
        get = item.get if isinstance(item, Mapping) else lambda k, d=None, o=item: getattr(o, k, d)
        function = get("function") or item
        fget = function.get if isinstance(function, Mapping) else lambda k, d=None, o=function: getattr(o, k, d)
        name = fget("name")
        if name:
            arguments = fget("arguments", fget("args", get("args")))
            calls.append(ToolCall(name, _arguments(arguments if arguments is not None else {}), get("id") or ""))
    return calls


class ToolCalling:
    """Puts tools in front of a model and reads its calls back."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        tools: Sequence[Any],
        tool_choice: ToolChoice = "auto",
        *,
        required: bool = False,
    ) -> None:
        """`tools`: ToolSpecs, OpenAI tool dicts or LlamaIndex tools; `tool_choice`: any form `tool_choice_name`
        reads."""
        self.tokenizer = tokenizer
        specs = [ToolSpec.from_any(t) for t in tools]
        self.tools = list(
            {json.dumps(t.openai(), sort_keys=True): t for t in specs}.values()
        )  # the same tool twice: once
        names = [t.name for t in self.tools]
        shared = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if shared is not None:
            raise CallInputError(
                f"two different tools share the name {shared!r}; tool names must be unique, got {names}",
                "tools.function.name",
            )
        self.tool_choice = tool_choice_name(tool_choice, names, required=required)
        self._native: bool | None = None

    @classmethod
    def of_call(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        tools: Sequence[Any] | None,
        tool_choice: ToolChoice = None,
        *,
        required: bool = False,
    ) -> ToolCalling | None:
        """A call's tool calling, or None without tools (a forcing tool_choice without tools is refused)."""
        if not tools:
            if tool_choice not in (None, "auto", "none", False) or required:
                raise CallInputError(
                    f"tool_choice={tool_choice!r} needs tools: bind them (bind_tools, chat_with_tools, tools=)",
                    "tool_choice",
                )
            return None
        return cls(tokenizer, tools, tool_choice, required=required)

    @property
    def forced(self) -> list[ToolSpec]:
        """The tools one of which must be called ([] unless tool_choice is required or a name)."""
        if self.tool_choice == "required":
            return list(self.tools)
        return [t for t in self.tools if t.name == self.tool_choice]

    @property
    def arguments_only(self) -> ToolSpec | None:
        """The one tool a call is forced to (tool_choice names it, or "required" with one tool), or None. Its call is
        decoded as the arguments alone, under the tool's own schema, with no tool block in the prompt (the prompt of a
        JSON-schema answer), and wrapped into the call afterwards. Measured on SmolLM2 and gemma3: a
        `{"name": ..., "arguments":` prefix pulled the arguments back to the model's memory, and a tool block before a
        bare-arguments answer made a retrieval query of the tool's name ("search_documents.search_")."""
        forced = self.forced
        return forced[0] if len(forced) == 1 else None

    def missing_call_note(self, calls: Sequence[ToolCall], max_new_tokens: int) -> str | None:
        """The note for a forced call that gave no readable call (cut at `max_new_tokens`); None when nothing is
        missing."""
        if calls or not self.forced:
            return None
        return (
            f"tool_choice={self.tool_choice!r} forced a call, but none could be read: the model wrote no complete call "
            f"(max_new_tokens={max_new_tokens}); raise max_new_tokens"
        )

    @property
    def native(self) -> bool:
        """The tokenizer's chat template renders `tools=` itself (checked once by rendering a probe tool)."""
        if self._native is None:
            self._native = _renders_tools(self.tokenizer)
        return self._native

    def openai_tools(self) -> list[dict]:
        """The tools in OpenAI's shape, as chat templates take them."""
        return [t.openai() for t in self.tools]

    def system_block(self) -> str | None:
        """The fallback format's system text (None when the chat template renders the tools itself)."""
        return None if self.native else self.fallback_text()

    def fallback_text(self) -> str | None:
        """The fallback format's system text whatever the template (None without tools): the tools and how to call."""
        if not self.tools or self.tool_choice == "none":
            return None  # no call may be made: the tools are not offered
        listed = "\n".join(json.dumps(t.openai()) for t in self.tools)
        if self.arguments_only is not None:  # the answer is the arguments alone, asked as a JSON-schema answer is
            return None
        how = (
            "To call a tool, answer with a JSON object inside <tool_call></tool_call> tags, one per call:\n"
            '<tool_call>\n{"name": <tool name>, "arguments": <arguments object>}\n</tool_call>'
        )
        if self.tool_choice == "required":  # of several tools (one named or one alone: `arguments_only`)
            how += "\nYou must call one of the tools."
        return f"You can call these tools:\n<tools>\n{listed}\n</tools>\n{how}"

    def constraint(self) -> dict | None:
        """A JSON schema of what a forced call writes: the one tool's arguments (`arguments_only`), or one valid call of
        several tools for "required"; None when no call is forced."""
        forced = self.forced
        if not forced:
            return None
        if len(forced) == 1:  # the arguments alone (`arguments_only`)
            return closed_schema(dict(forced[0].parameters))
        return {"anyOf": [_call_schema(t, f"/anyOf/{i}") for i, t in enumerate(forced)]}

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content with the calls removed, calls): `<tool_call>` blocks, or the whole text as one bare JSON call.
        Invalid JSON, an unknown tool or tool_choice 'none' gives no call and keeps the text as content."""
        if self.tool_choice == "none" or not self.tools:
            return text, []
        stripped = text.strip()
        only = self.arguments_only
        if only is not None:  # the whole answer is the forced tool's arguments
            try:
                arguments = json.loads(stripped)
            except ValueError:
                return text, []
            return ("", [ToolCall(only.name, arguments)]) if isinstance(arguments, dict) else (text, [])
        if stripped.startswith(("{", "[")):
            calls = self._calls(stripped)
            if calls:
                return "", calls
        calls, kept, last = [], [], 0
        for match in _BLOCK.finditer(text):
            found = self._calls(match.group(1))
            if found:
                calls += found
                kept.append(text[last : match.start()])
                last = match.end()
        if not calls:
            return text, []
        kept.append(text[last:])
        return "".join(kept).strip(), calls

    def _calls(self, blob: str) -> list[ToolCall]:
        try:
            value = json.loads(blob)
        except ValueError:
            return []
        items = value if isinstance(value, list) else [value]
        calls = [self._call(item) for item in items]
        return [c for c in calls if c is not None] if all(calls) else []

    def _call(self, item: object) -> ToolCall | None:
        if not isinstance(item, dict) or item.get("name") not in {t.name for t in self.tools}:
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        call_id = item.get("id")
        return ToolCall(item["name"], arguments, call_id if isinstance(call_id, str) and call_id else new_call_id())

    def render_call(self, call: ToolCall) -> str:
        """An earlier assistant call as prompt text, in the format the model is asked to write."""
        return render_call(call)

    def render_result(self, content: str) -> str:
        """A tool's result as prompt text in the fallback format (a user turn's content)."""
        return f"<tool_response>\n{content}\n</tool_response>"

    def render_calls(self, content: str, calls: Sequence[ToolCall]) -> str:
        """An assistant turn's text: its content, then its calls."""
        return render_calls(content, calls)


def render_call(call: ToolCall) -> str:
    """An earlier assistant call as prompt text, in the format the model is asked to write."""
    return f"<tool_call>\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n</tool_call>"


def render_calls(content: str, calls: Sequence[ToolCall]) -> str:
    """An assistant turn's text for the prompt: its content, then its earlier calls."""
    return "\n".join([*([content] if content.strip() else []), *(render_call(c) for c in calls)])


def _renders_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = ToolSpec(_PROBE, "probe", {"type": "object", "properties": {}})
    try:
        text = render_chat(tokenizer, [{"role": "user", "content": "hi"}], tools=[probe.openai()])
    except Exception:  # a template that refuses tools= (jinja2 errors of any kind)
        return False
    return _PROBE in text


class ToolCallStream:
    """Streams a tool-calling answer: `feed` returns the text safe to show now (text that cannot be part of a call
    is shown as it comes; a possible call is held back), `finish` the rest of the content and the calls."""

    _TAG = "<tool_call>"

    def __init__(self, calling: ToolCalling) -> None:
        self.calling = calling
        self.text = ""
        self.emitted = ""

    def _safe(self) -> str:
        text = self.text
        if self.calling.tool_choice == "none" or not self.calling.tools:
            return text
        if text.lstrip().startswith(("{", "[")) or self.calling.forced:
            return ""  # a bare JSON call may be coming (always, when a call is forced)
        cut = text.find(self._TAG)
        if cut < 0:
            cut = next(
                (len(text) - k for k in range(len(self._TAG) - 1, 0, -1) if text.endswith(self._TAG[:k])), len(text)
            )
        return text[:cut].rstrip()

    def feed(self, delta: str) -> str:
        """Take the next piece of the answer; return the new text safe to show."""
        self.text += delta
        safe = self._safe()
        if len(safe) <= len(self.emitted) or not safe.startswith(self.emitted):
            return ""
        new, self.emitted = safe[len(self.emitted) :], safe
        return new

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(the content not shown yet, the calls) once the answer is complete."""
        content, calls = self.calling.parse(self.text)
        shown = self.emitted if not calls else self.emitted.strip()
        if not content.startswith(shown):  # cannot happen for text parse keeps; never drop what was not shown
            return content, calls
        return content[len(shown) :], calls
