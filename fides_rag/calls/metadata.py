"""The FIDES record of one answer, the same for every front door (LangChain's response_metadata, LlamaIndex's
additional_kwargs, the server's `fides` field): the result's method, alphas, steps and prompts, with what the plan
knows (its notes first, where the documents came from, trimming) and what the call asked for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fides_rag.result import GenerationResult

if TYPE_CHECKING:
    from fides_rag.calls.planning import ChatPlan
    from fides_rag.calls.tools import ToolCalling

FINISH_REASONS = {"eos": "stop", "stop": "stop", "criteria": "stop", "length": "length", "cancelled": "stop"}
"""The engine's finish reasons as OpenAI's (a parsed tool call makes it "tool_calls")."""


def record(
    plan: ChatPlan,
    result: GenerationResult,
    requested: str,
    *,
    calling: ToolCalling | None = None,
    native_tools: bool = False,
    notes: Sequence[str] = (),
    **extra: object,
) -> dict[str, Any]:
    """The record: `plan.metadata(result)` with the method asked for, the fallback (None: the documents were used as
    asked), the tools' format and choice when tools were bound, the call's own `notes` last, and `extra`."""
    meta: dict[str, Any] = {**plan.metadata(result), "requested_method": requested, "fallback": plan.fallback, **extra}
    if calling is not None:
        meta["tool_format"] = "native" if native_tools else "fallback"
        meta["tool_choice"] = calling.tool_choice
    if notes:
        meta["notes"] = list(dict.fromkeys([*meta["notes"], *notes]))
    return meta


def usage(result: GenerationResult) -> dict[str, int]:
    """Token counts in OpenAI's shape."""
    completion = len(result.token_ids)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
    }
