"""Tool calls as OpenAI's streamed deltas: per call, a first `delta.tool_calls[0]` with its `index`, `id`, `type`
and `function.name` (arguments empty), then its `function.arguments` in pieces; the stream ends with
`finish_reason: "tool_calls"`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from fides_rag.calls import ToolCall

PIECE_CHARS = 24
"""Characters of arguments per delta."""


def tool_call_deltas(calls: Sequence[ToolCall]) -> Iterator[dict[str, Any]]:
    """The `delta` of each chunk that streams `calls`."""
    for index, call in enumerate(calls):
        yield {
            "tool_calls": [
                {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            ]
        }
        arguments = json.dumps(call.arguments)
        for at in range(0, len(arguments), PIECE_CHARS):
            yield {"tool_calls": [{"index": index, "function": {"arguments": arguments[at : at + PIECE_CHARS]}}]}
