"""FidesLLM's per-call keywords (the core's options, `fides_rag.calls.CallOptions`, and what a LlamaIndex call adds)."""

from __future__ import annotations

from fides_rag.calls import CALL, CONSTRAINTS, FidesFallbackError, UnansweredError, options_of
from fides_rag.calls.options import SAMPLING

__all__ = ["CALL_OPTIONS", "CONSTRAINTS", "FidesFallbackError", "GENERATION_OPTIONS", "UnansweredError"]

GENERATION_OPTIONS: tuple[str, ...] = ("method", "max_new_tokens", "stop", *SAMPLING)
"""Per-call overrides accepted by complete/chat/predict and their stream/async forms."""
CALL_OPTIONS: tuple[str, ...] = (*options_of(CALL), "documents", "no_context_prompt", "tools", "tool_choice")
"""Every keyword a call may pass: the request options of a call (`fides_rag.generation.request_options`) and
LlamaIndex's own."""
