"""The generation settings of one call: budget, sampling, stop strings, user processors and criteria."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from transformers import (
    LogitsProcessorList,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from fides_rag.generation.request_options import REQUEST_OPTIONS

GREEDY_BELOW_TEMPERATURE = 1e-5
"""A sampling temperature below this decodes greedily (vLLM's convention): the limit of sampling as the
temperature goes to 0, which dividing the scores by it cannot reach without overflowing them."""


def _default(name: str) -> Any:
    return REQUEST_OPTIONS[name].default


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def sampling_options(
    do_sample: Any, temperature: Any = None, top_p: Any = 1.0, top_k: Any = 0, seed: Any = None
) -> dict[str, Any]:
    """A framework call's sampling knobs as the decoder's keywords: none under greedy decoding (a framework's
    default temperature or top_p would only warn there), and temperature 0 means greedy (LangChain's and
    OpenAI's convention). Values are passed on unchecked, so `GenerationSettings` names a bad one."""
    if do_sample is False or (temperature is not None and _is_number(temperature) and temperature == 0):
        return {}
    return {
        "do_sample": do_sample,
        "temperature": 1.0 if temperature is None else temperature,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
    }


def _stacklevel_outside_package() -> int:
    """The `warnings.warn` stacklevel, for the function calling this one, of the first frame outside fides_rag:
    a warning then points at the user's line however deep the public call went."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "fides_rag":
        frame, level = frame.f_back, level + 1
    return level


@dataclass(frozen=True)
class GenerationSettings:
    """Per-call generation controls, validated; their defaults, meaning and error texts are the request options'
    (`fides_rag.generation.request_options`)."""

    max_new_tokens: int = _default("max_new_tokens")
    min_new_tokens: int = _default("min_new_tokens")
    do_sample: bool = _default("do_sample")
    temperature: float = _default("temperature")
    top_p: float = _default("top_p")
    top_k: int = _default("top_k")
    seed: int | None = _default("seed")
    stop: tuple[str, ...] = ()
    logits_processor: LogitsProcessorList | None = _default("logits_processor")
    stopping_criteria: StoppingCriteriaList | None = _default("stopping_criteria")
    json_schema: Any = _default("json_schema")
    regex: str | None = _default("regex")
    grammar: Any = _default("grammar")
    logprobs: int | None = _default("logprobs")

    def __post_init__(self) -> None:
        REQUEST_OPTIONS["max_new_tokens"].check(self.max_new_tokens)
        if (
            not isinstance(self.min_new_tokens, int)
            or isinstance(self.min_new_tokens, bool)
            or not 0 <= self.min_new_tokens <= self.max_new_tokens
        ):
            raise ValueError(REQUEST_OPTIONS["min_new_tokens"].error(self.min_new_tokens))
        for name in ("do_sample", "temperature", "top_p", "top_k", "seed"):
            REQUEST_OPTIONS[name].check(getattr(self, name))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        for name in ("temperature", "top_p"):  # an int (temperature=2) is valid; transformers' warpers take floats only
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.do_sample and self.temperature < GREEDY_BELOW_TEMPERATURE:  # greedy, in the greedy lane
            for name, value in (
                ("do_sample", False),
                ("temperature", 1.0),
                ("top_p", 1.0),
                ("top_k", 0),
                ("seed", None),
            ):
                object.__setattr__(self, name, value)
        constraints = [name for name in ("json_schema", "regex", "grammar") if getattr(self, name) is not None]
        if len(constraints) > 1:
            raise ValueError(f"give at most one of json_schema=, regex= and grammar=, got {', '.join(constraints)}")
        REQUEST_OPTIONS["logprobs"].check(self.logprobs)
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError(f"regex must be a string, got {type(self.regex).__name__}")
        if not self.do_sample and (
            self.temperature != 1.0 or self.top_p != 1.0 or self.top_k != 0 or self.seed is not None
        ):
            warnings.warn(
                "temperature/top_p/top_k/seed have no effect with greedy decoding; pass do_sample=True to sample",
                stacklevel=_stacklevel_outside_package(),
            )

    @classmethod
    def build(cls, default_max_new_tokens: int, options: Mapping[str, Any]) -> GenerationSettings:
        """Settings of one public call from its generation options (`GenerationOptions`): the token budget
        defaults to the decoder's, and a single stop string may be given bare."""
        rest = dict(options)
        max_new_tokens, stop = rest.pop("max_new_tokens", None), rest.pop("stop", None)
        if isinstance(stop, str):
            stop = [stop]
        return cls(
            max_new_tokens=default_max_new_tokens if max_new_tokens is None else max_new_tokens,
            stop=tuple(stop or ()),
            **rest,
        )

    def unit_processors(self) -> LogitsProcessorList | None:
        """The user's logits processors of one request (None when there are none): they see that request's context
        prompt and answer, as when it decodes alone. min_new_tokens is not among them: the engine holds EOS back for
        every such request at once (transformers' `MinNewTokensLengthLogitsProcessor`, batched)."""
        return LogitsProcessorList(self.logits_processor) if self.logits_processor else None

    def sampling_warpers(self) -> LogitsProcessorList:
        """transformers' sampling warpers (temperature, top-k, top-p): row by row, so shared by every request
        with the same sampling settings; empty under greedy decoding."""
        warpers = LogitsProcessorList()
        if self.do_sample:
            if self.temperature != 1.0:
                warpers.append(TemperatureLogitsWarper(self.temperature))
            if self.top_k > 0:
                warpers.append(TopKLogitsWarper(self.top_k))
            if self.top_p < 1.0:
                warpers.append(TopPLogitsWarper(self.top_p))
        return warpers

    @property
    def constrained(self) -> bool:
        """Whether the answer is held to a JSON schema, regex or grammar."""
        return any(getattr(self, name) is not None for name in ("json_schema", "regex", "grammar"))

    def sampling_key(self) -> tuple:
        """What requests decoded in one lane must share (everything else is held per request)."""
        return (self.do_sample, self.temperature, self.top_p, self.top_k)
