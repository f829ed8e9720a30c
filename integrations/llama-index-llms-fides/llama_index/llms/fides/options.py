"""FidesLLM's per-call keywords, and FIDES's constants given by name folded into one FidesConfig."""

from __future__ import annotations

import dataclasses
from typing import Any

from fides_rag import FidesConfig
from fides_rag.calls import CONSTRAINTS, FidesFallbackError

__all__ = ["CALL_OPTIONS", "CONSTRAINTS", "FidesFallbackError", "GENERATION_OPTIONS", "fold_fides_constants"]

GENERATION_OPTIONS: tuple[str, ...] = ("method", "max_new_tokens", "stop", "do_sample", "temperature", "top_p", "top_k", "seed")
"""Per-call overrides accepted by complete/chat/predict and their stream/async forms."""
CALL_OPTIONS: tuple[str, ...] = (*GENERATION_OPTIONS, *CONSTRAINTS, "strict", "documents", "no_context_prompt", "tools", "tool_choice")
FIDES_CONSTANTS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FidesConfig) if f.name != "source")
"""FidesConfig's fields: also accepted by name at construction (weights=, lambda_=, ...) and folded into fides_config."""


def fold_fides_constants(kwargs: dict[str, Any], base: FidesConfig) -> None:
    """Replace FIDES constants given by name (weights=0.4,...) in `kwargs` by `fides_config=` built on `base`."""
    named = {k: kwargs.pop(k) for k in FIDES_CONSTANTS if k in kwargs}
    if not named:
        return
    if kwargs.get("fides_config") is not None:
        raise TypeError(f"pass fides_config= or the FIDES constants {sorted(named)} by name, not both")
    kwargs["fides_config"] = dataclasses.replace(base, **{k: tuple(v) if k == "weights" else v for k, v in named.items()})
