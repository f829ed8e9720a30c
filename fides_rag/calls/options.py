"""One call's options, parsed once for every front door (LangChain, LlamaIndex, the server): the rule (the method
checked by the registry, with its FidesConfig where the rule takes one), the budget, stops, sampling, at most one
grammar constraint and strict mode; and the one fallback check with its one error."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from fides_rag.errors import CallInputError, FidesFallbackError
from fides_rag.generation.request_options import CALL, REQUEST_OPTIONS, options_of
from fides_rag.generation.settings import sampling_options
from fides_rag.method.config import FidesConfig
from fides_rag.prompts.template import document_texts
from fides_rag.rules import ContrastRule, accepts_option, get_method

logger = logging.getLogger("fides_rag.calls")


class FallbackPlan(Protocol):
    """What `check_fallback` reads of a call's plan (`ChatPlan`, which imports this module's options)."""

    fallback: str | None
    notes: list[str]


_T = TypeVar("_T")

CONSTRAINTS = options_of(CALL, "constraint")
"""Grammar-constrained decoding options (at most one per call)."""
SAMPLING = options_of(CALL, "sampling")
OPTIONS = frozenset(options_of(CALL))
"""What a call may set (each front door adds its own: documents, tools, ...); declared in `REQUEST_OPTIONS`."""


FIDES_CONSTANTS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(FidesConfig) if f.name != "source")
"""FidesConfig's fields, which a front door may also take by name (weights=, lambda_=, ...)."""


def fold_fides_constants(kwargs: dict[str, Any], base: FidesConfig) -> None:
    """Replace FIDES constants given by name in `kwargs` (weights=0.4, ...) by `fides_config=` built on `base`."""
    named = {k: kwargs.pop(k) for k in FIDES_CONSTANTS if k in kwargs}
    if not named:
        return
    if kwargs.get("fides_config") is not None:
        raise TypeError(f"pass fides_config= or the FIDES constants {sorted(named)} by name, not both")
    changes: dict[str, Any] = {
        k: tuple(v) if k == "weights" else v for k, v in named.items()
    }  # FidesConfig checks each
    kwargs["fides_config"] = dataclasses.replace(base, **changes)


def plain_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """One call's options as plain values, sorted by name (a framework's cache key): documents as their texts, any
    other value that is not a plain one as its repr; keys of LangSmith's (`ls_...`) left out."""
    options: dict[str, Any] = {}
    for name in sorted(k for k in kwargs if not k.startswith("ls_")):
        value = kwargs[name]
        if name == "documents":
            try:
                value = document_texts(value)
            except TypeError:  # reported by the call itself
                value = repr(value)
        elif not isinstance(value, (str, int, float, bool, type(None), list)):
            value = repr(value)
        options[name] = value
    return options


def split_template_args(
    args: Mapping[str, Any], variables: Iterable[str], options: Iterable[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A prompt template call's keywords as (template variables, call options): a key the template uses (one of
    `variables`) is always a variable; a name of `options` that it does not use (method, max_new_tokens, ...) is an
    option of the call."""
    used, known = set(variables), set(options)
    call = {k: v for k, v in args.items() if k in known and k not in used}
    return {k: v for k, v in args.items() if k not in call}, call


def resolve_method(
    method: str | ContrastRule, config: FidesConfig | None = None, *, explicit_config: bool = False
) -> str | ContrastRule:
    """`method` checked by the registry, as a rule with `config` where the rule takes a FidesConfig (else as given, so
    the decoder's own configured rule decodes its name). `explicit_config`: the caller set `config` on this call, so a
    rule that takes none refuses it."""
    get_method(method)
    if config is None or not isinstance(method, str):
        return method
    if not isinstance(config, FidesConfig):
        raise TypeError(f"fides_config must be a FidesConfig, got {type(config).__name__}")
    if accepts_option(method, "config"):
        return get_method(method, config=config)
    if explicit_config:
        raise CallInputError(
            f"fides_config applies to methods that take a FidesConfig (fides and its variants), not {method!r}",
            "fides_config",
        )
    return method


def positive_budget(value: object) -> int:
    """`value` as a token budget (a positive integer), or a ValueError naming max_new_tokens."""
    return cast(int, _checked("max_new_tokens", value))  # checked: a positive integer


def _checked(name: str, value: _T) -> _T:
    """`value` of option `name`, or a CallInputError naming the option and what it must be."""
    try:
        REQUEST_OPTIONS[name].check(value)
    except ValueError as err:
        raise CallInputError(str(err), name) from None
    return value


@dataclass
class CallOptions:
    """How one call decodes: `method` (a name or a configured rule), `requested` (its name), the budget, stops, sampling
    keywords, at most one grammar constraint, and strict mode."""

    method: str | ContrastRule
    requested: str
    max_new_tokens: int
    stop: list[str] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    constraint: dict[str, Any] = field(default_factory=dict)
    strict: bool = False

    @classmethod
    def parse(
        cls,
        defaults: Mapping[str, Any],
        call: Mapping[str, Any],
        *,
        allowed: Sequence[str] = (),
        who: str = "this call",
    ) -> CallOptions:
        """`defaults` (an object's fields: method, fides_config, max_new_tokens, stop, strict, sampling) overridden by
        `call` (one call's keywords). Keywords outside `OPTIONS` and `allowed` raise a TypeError naming them."""
        unknown = sorted(k for k in call if k not in OPTIONS and k not in allowed)
        if unknown:
            raise TypeError(
                f"{who} got unsupported call options {unknown} (unsupported keyword arguments are refused, never "
                f"dropped); supported: {sorted({*OPTIONS, *allowed})}"
            )
        merged = {**defaults, **{k: v for k, v in call.items() if k in OPTIONS}}
        constraint = {k: call[k] for k in CONSTRAINTS if call.get(k) is not None}
        if len(constraint) > 1:
            raise CallInputError(
                f"give at most one of json_schema=, regex= and grammar=, got {', '.join(constraint)}",
                next(iter(constraint)),
            )
        asked = merged.get("method") or REQUEST_OPTIONS["method"].default
        method = asked
        try:
            method = resolve_method(
                method, merged.get("fides_config"), explicit_config=call.get("fides_config") is not None
            )
        except (CallInputError, TypeError):
            raise
        except ValueError as err:
            raise CallInputError(str(err), "method") from None
        requested = asked if isinstance(asked, str) else asked.name
        strict = merged.get("strict", REQUEST_OPTIONS["strict"].default)
        if not isinstance(strict, bool):
            raise TypeError(REQUEST_OPTIONS["strict"].error(strict))
        stop = merged.get("stop") or []
        stops = [stop] if isinstance(stop, str) else [s for s in stop if isinstance(s, str) and s]
        _checked("seed", merged.get("seed"))  # greedy or not
        sampling = sampling_options(*(merged.get(k, REQUEST_OPTIONS[k].default) for k in SAMPLING))
        budget = positive_budget(merged.get("max_new_tokens", REQUEST_OPTIONS["max_new_tokens"].default))
        return cls(method, requested, budget, list(dict.fromkeys(stops)), sampling, constraint, strict)

    def check_fallback(self, plan: FallbackPlan) -> None:
        """Raise FidesFallbackError under strict mode, else log a warning, when `plan` cannot use the documents as asked
        (a call that asked for 'standard' loses nothing)."""
        if plan.fallback is None or self.requested == "standard":
            return
        if self.strict:
            raise FidesFallbackError(
                f"strict=True: {plan.fallback}, so method {self.requested!r} has nothing to contrast as asked. "
                "Pass the "
                "documents (documents=, a retriever, a context variable) with their texts as they appear in the "
                "prompt, or "
                f"set strict=False to accept the fallback (it is then logged and recorded in the notes)"
            )
        logger.warning(plan.notes[0])
