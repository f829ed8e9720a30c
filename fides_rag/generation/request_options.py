"""The request options a caller can set, declared once: each option's name, default, bounds, meaning, the error text
of a bad value, and the front doors that take it. `GenerationSettings` validates with it, `CallOptions` takes its
names and checks, the adapters' `DecodingFields` and the server's request fields take their defaults, bounds and
descriptions from it (`option_field`), and the typed `**options` (`MethodOptions`) are checked against it by the tests.
A new option is added here, then declared with its type where a front door takes it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fides_rag.generation.engine.logprobs import MAX_TOP_LOGPROBS

__all__ = ["MAX_SEED", "MAX_TEMPERATURE", "REQUEST_OPTIONS", "RequestOption", "option_field", "options_of"]

MAX_SEED = 2**63 - 1
MAX_TEMPERATURE = 1e30
"""Above this, the temperature is not representable next to float32 scores (dividing by it gives NaN)."""

DECODER = "decoder"
"""The decoder's keyword options (`MethodOptions`) and `GenerationSettings` where it is a generation setting."""
CALL = "call"
"""One framework call's keywords (`CallOptions.parse`)."""
FIELDS = "fields"
"""The adapters' model-object fields (`DecodingFields`)."""
SERVER = "server"
"""The server's request fields (`fides_rag.serve.protocol`), under their HTTP name."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_none_or(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


@dataclass(frozen=True)
class RequestOption:
    """One request option: its `default`, `description`, the pydantic `bounds` its fields carry, the `accepts` check
    and the `requirement` a bad value's error states ("<name> must <requirement>, got <value>"), the option `group`
    (sampling, constraint) and the front doors (`where`) that take it, by name (`http_name` over HTTP)."""

    name: str
    default: Any
    description: str
    where: frozenset[str]
    bounds: Mapping[str, Any] = field(default_factory=dict)
    accepts: Callable[[Any], bool] | None = None
    requirement: str = ""
    group: str = ""
    http_name: str = ""

    def check(self, value: Any) -> None:
        """A ValueError naming this option and what it must be, when `value` is not accepted."""
        if self.accepts is not None and not self.accepts(value):
            raise ValueError(self.error(value))

    def error(self, value: Any) -> str:
        return f"{self.name} must {self.requirement}, got {value!r}"

    @property
    def over_http(self) -> str:
        return self.http_name or self.name


def _option(name: str, default: Any, description: str, *where: str, **rest: Any) -> RequestOption:
    return RequestOption(name, default, description, frozenset(where), **rest)


REQUEST_OPTIONS: dict[str, RequestOption] = {
    o.name: o
    for o in (
        _option(
            "method",
            "fides",
            "Decoding method: fides (default), standard, cad, adacad, or any rule of "
            "fides_rag.available_methods() (register_method adds one), optionally behind a gate of "
            "fides_rag.available_gates() as rule+gate (e.g. fides+agree).",
            DECODER,
            CALL,
            FIELDS,
            SERVER,
        ),
        _option(
            "methods",
            None,
            "Several methods decoded over one shared prefill (a list, or a mapping label -> method); "
            "the call then returns label -> result(s).",
            DECODER,
        ),
        _option(
            "fides_config",
            None,
            "FIDES's constants as a fides_rag.FidesConfig (e.g. FidesConfig.from_file('calibrated.json') "
            "from `fides-rag calibrate`); None: the decoder's.",
            CALL,
            FIELDS,
            SERVER,
        ),
        _option(
            "max_new_tokens",
            128,
            "Most tokens to generate per call (unset: the decoder's own budget).",
            DECODER,
            CALL,
            FIELDS,
            SERVER,
            bounds={"gt": 0},
            accepts=lambda v: _is_int(v) and v > 0,
            requirement="be a positive integer",
            http_name="max_tokens",
        ),
        _option(
            "min_new_tokens",
            0,
            "EOS is suppressed until this many tokens exist (transformers' semantics).",
            DECODER,
            bounds={"ge": 0},
            requirement="be an integer in [0, max_new_tokens]",
        ),
        _option(
            "stop",
            None,
            "Stop strings of any token length; the answer is cut before the first one.",
            DECODER,
            CALL,
            FIELDS,
            SERVER,
        ),
        _option(
            "do_sample",
            False,
            "Sample instead of greedy decoding.",
            DECODER,
            CALL,
            FIELDS,
            accepts=lambda v: isinstance(v, bool),
            requirement="be True or False",
            group="sampling",
        ),
        _option(
            "temperature",
            1.0,
            "Sampling temperature (only with do_sample=True).",
            DECODER,
            CALL,
            FIELDS,
            SERVER,
            bounds={"gt": 0, "le": MAX_TEMPERATURE},
            accepts=lambda v: _is_number(v) and math.isfinite(v) and 0 < v <= MAX_TEMPERATURE,
            requirement=f"be a number in (0, {MAX_TEMPERATURE:g}] (use do_sample=False for greedy)",
            group="sampling",
        ),
        _option(
            "top_p",
            1.0,
            "Nucleus sampling mass (only with do_sample=True).",
            DECODER,
            CALL,
            FIELDS,
            SERVER,
            bounds={"gt": 0, "le": 1},
            accepts=lambda v: _is_number(v) and 0 < v <= 1,
            requirement="lie in (0, 1]",
            group="sampling",
        ),
        _option(
            "top_k",
            0,
            "Top-k sampling cut-off, 0 disables it (only with do_sample=True).",
            DECODER,
            CALL,
            FIELDS,
            bounds={"ge": 0},
            accepts=lambda v: _is_int(v) and v >= 0,
            requirement="be an integer >= 0 (0 disables it)",
            group="sampling",
        ),
        _option(
            "seed",
            None,
            "Seed of the sampler, for reproducible sampling (only with do_sample=True); checked whatever "
            "the temperature.",
            DECODER,
            CALL,
            FIELDS,
            SERVER,
            bounds={"ge": 0, "le": MAX_SEED},
            accepts=_is_none_or(lambda v: _is_int(v) and 0 <= v <= MAX_SEED),
            requirement="be None or an integer in [0, 2**63 - 1]",
            group="sampling",
        ),
        _option("logits_processor", None, "transformers' logits processors of this request.", DECODER),
        _option("stopping_criteria", None, "transformers' stopping criteria of this request.", DECODER),
        _option(
            "json_schema",
            None,
            "Constrain the answer to JSON valid under this schema (a dict, JSON text or a pydantic model class).",
            DECODER,
            CALL,
            SERVER,
            group="constraint",
            http_name="response_format",
        ),
        _option(
            "regex",
            None,
            "Constrain the answer to a match of this regular expression.",
            DECODER,
            CALL,
            group="constraint",
        ),
        _option(
            "grammar",
            None,
            "Constrain the answer to this Lark or GBNF grammar (text), or a compiled GrammarConstraint.",
            DECODER,
            CALL,
            group="constraint",
        ),
        _option(
            "logprobs",
            None,
            "Record each token's log-probability with this many most likely alternatives "
            f"(0 to {MAX_TOP_LOGPROBS}; None: record none).",
            DECODER,
            SERVER,
            bounds={"ge": 0, "le": MAX_TOP_LOGPROBS},
            accepts=_is_none_or(lambda v: _is_int(v) and 0 <= v <= MAX_TOP_LOGPROBS),
            requirement=f"be None or an integer in [0, {MAX_TOP_LOGPROBS}] (alternatives per token)",
        ),
        _option(
            "strict",
            False,
            "Raise FidesFallbackError instead of falling back (to `standard` when a call has no context "
            "to contrast, or to guessing the context); also per call: strict=True.",
            CALL,
            FIELDS,
            accepts=lambda v: isinstance(v, bool),
            requirement="be True or False",
        ),
        _option(
            "no_context_path",
            "emptied",
            "How the no-context path is built from a framework's prompt: 'emptied' (the "
            "same prompt with the retrieved text removed) or 'question' (the neutral 'Answer the following "
            "question:' and "
            "the question alone, in the model's chat form). fides-rag's own template (documents= with a bare "
            "question) is "
            "not affected.",
            FIELDS,
            SERVER,
        ),
    )
}
"""Every request option, in the order `GenerationSettings` checks them."""


def options_of(where: str, group: str | None = None) -> tuple[str, ...]:
    """The names of the options a front door (`where`) takes, optionally of one `group`."""
    return tuple(o.name for o in REQUEST_OPTIONS.values() if where in o.where and (group is None or o.group == group))


def option_field(name: str, **overrides: Any) -> Any:
    """A pydantic `Field` of option `name` with its default, bounds and description; `overrides` replace any of them
    (the server's fields default to None: unset, the front door's default)."""
    from pydantic import Field  # pydantic only where fields are declared

    option = REQUEST_OPTIONS[name]
    return Field(**{"default": option.default, "description": option.description, **option.bounds, **overrides})
