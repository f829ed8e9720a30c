"""FidesLLM's options: what a call may override, their checks, and FIDES's constants as one FidesConfig."""

from __future__ import annotations

import dataclasses
from typing import Any

from fides_rag import FidesConfig, available_methods
from fides_rag.generation.settings import sampling_options

GENERATION_OPTIONS: tuple[str, ...] = ("method", "max_new_tokens", "stop", "do_sample", "temperature", "top_p", "top_k", "seed")
"""Per-call overrides accepted by complete/chat/predict and their stream/async forms."""
CONSTRAINTS: tuple[str, ...] = ("json_schema", "regex", "grammar")
"""Grammar-constrained decoding options (at most one per call): the answer is held to a JSON schema, a regex or a
Lark grammar."""
TOOL_OPTIONS: tuple[str, ...] = ("tools", "tool_choice")
"""What `_prepare_chat_with_tools` hands to chat: the tools (LlamaIndex tools, ToolSpec or OpenAI dicts) and the choice."""
CALL_OPTIONS: tuple[str, ...] = (*GENERATION_OPTIONS, *CONSTRAINTS, "strict", "documents", "no_context_prompt", *TOOL_OPTIONS)
FIDES_CONSTANTS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FidesConfig) if f.name != "source")
"""FidesConfig's fields. FidesLLM takes them as one `fides_config=`; the names alone (weights=, lambda_=, ...)
are still accepted at construction and folded into it."""


class FidesFallbackError(ValueError):
    """Raised with `strict=True` where FidesLLM would otherwise decode with `standard` for want of a context."""


def fold_fides_constants(kwargs: dict[str, Any], base: FidesConfig) -> None:
    """Replace FIDES constants given by name (weights=0.4,...) in `kwargs` by `fides_config=` built on `base`."""
    named = {k: kwargs.pop(k) for k in FIDES_CONSTANTS if k in kwargs}
    if not named:
        return
    if kwargs.get("fides_config") is not None:
        raise TypeError(f"pass fides_config= or the FIDES constants {sorted(named)} by name, not both")
    kwargs["fides_config"] = dataclasses.replace(base, **{k: tuple(v) if k == "weights" else v for k, v in named.items()})


def call_options(llm: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """One call's options: `llm`'s fields overridden by the call's keywords (unknown keywords raise TypeError)."""
    unknown = set(kwargs) - set(CALL_OPTIONS)
    if unknown:
        raise TypeError(f"FidesLLM got unsupported keyword argument(s) {sorted(unknown)}; supported: {list(CALL_OPTIONS)}")
    options = {name: getattr(llm, name) for name in GENERATION_OPTIONS}
    options.update({k: v for k, v in kwargs.items() if k in GENERATION_OPTIONS})
    constraint = {k: kwargs[k] for k in CONSTRAINTS if kwargs.get(k) is not None}
    if len(constraint) > 1:
        raise ValueError(f"give at most one of json_schema=, regex= and grammar=, got {', '.join(constraint)}")
    options["constraint"] = constraint
    options["strict"] = kwargs.get("strict", llm.strict)
    if not isinstance(options["strict"], bool):
        raise TypeError(f"strict must be True or False, got {options['strict']!r}")
    if options["method"] not in available_methods() and not hasattr(options["method"], "combine"):
        raise ValueError(f"unknown method {options['method']!r}; choose one of {available_methods()}")
    return options


def decoding_options(options: dict[str, Any]) -> dict[str, Any]:
    """The decoder's keywords for the budget, stops, sampling and grammar of `call_options` (no method, no strict)."""
    sampling = sampling_options(*(options[k] for k in ("do_sample", "temperature", "top_p", "top_k", "seed")))
    return {"max_new_tokens": options["max_new_tokens"], "stop": options["stop"], **sampling, **options.get("constraint", {})}
