"""Deprecated module name: tool calling lives in `fides_rag.calls.tools` (and `closed_schema` in
`fides_rag.calls.structure`); these names remain importable from here."""

from fides_rag.calls.structure import closed_schema
from fides_rag.calls.tools import CHOICES, ToolCall, ToolCallStream, ToolCalling, ToolSpec, new_call_id

__all__ = ["CHOICES", "ToolCall", "ToolCallStream", "ToolCalling", "ToolSpec", "closed_schema", "new_call_id"]
