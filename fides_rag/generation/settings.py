"""The generation settings of one call: budget, sampling, stop strings, user processors and criteria."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from fides_rag.generation.logprobs import MAX_TOP_LOGPROBS

MAX_SEED = 2**63 - 1
GREEDY_BELOW_TEMPERATURE = 1e-5
"""A sampling temperature below this decodes greedily (vLLM's convention): the limit of sampling as the
temperature goes to 0, which dividing the scores by it cannot reach without overflowing them."""
MAX_TEMPERATURE = 1e30
"""Above this, the temperature is not representable next to float32 scores (dividing by it gives NaN)."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    return {"do_sample": do_sample, "temperature": 1.0 if temperature is None else temperature, "top_p": top_p, "top_k": top_k, "seed": seed}


def _stacklevel_outside_package() -> int:
    """The `warnings.warn` stacklevel, for the function calling this one, of the first frame outside fides_rag:
    a warning then points at the user's line however deep the public call went."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "fides_rag":
        frame, level = frame.f_back, level + 1
    return level


class _MinNewTokensOnScoresDevice(MinNewTokensLengthLogitsProcessor):
    """transformers' min_new_tokens processor with its EOS ids moved to the scores' device at first use: that is the
    output head's device, known only then (CUDA, or the last device of a model split over several)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.eos_token_id.device != scores.device:
            self.eos_token_id = self.eos_token_id.to(scores.device)
        return super().__call__(input_ids, scores)


@dataclass(frozen=True)
class GenerationSettings:
    """Per-call generation controls (validated)."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    """EOS is suppressed until this many tokens exist (transformers' semantics; used to force full length)."""
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logits_processor: LogitsProcessorList | None = None
    stopping_criteria: StoppingCriteriaList | None = None
    json_schema: Any = None
    """Constrain the answer to JSON valid under this schema (a dict, JSON text or a pydantic model class)."""
    regex: str | None = None
    """Constrain the answer to a match of this regular expression."""
    grammar: Any = None
    """Constrain the answer to this Lark or GBNF grammar (text), or a compiled `GrammarConstraint`."""
    logprobs: int | None = None
    """Record each token's log-probability under the distribution it was chosen from, with this many most likely
    alternatives (0 to 20; None: record none)."""

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens) or self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not _is_int(self.min_new_tokens) or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be an integer in [0, max_new_tokens], got {self.min_new_tokens!r}")
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be True or False, got {self.do_sample!r}")
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or not 0 < self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be a number in (0, {MAX_TEMPERATURE:g}] (use do_sample=False for greedy), got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed must be None or an integer in [0, 2**63 - 1], got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        for name in ("temperature", "top_p"):  # an int (temperature=2) is valid; transformers' warpers take floats only
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.do_sample and self.temperature < GREEDY_BELOW_TEMPERATURE:  # greedy, in the greedy lane
            for name, value in (("do_sample", False), ("temperature", 1.0), ("top_p", 1.0), ("top_k", 0), ("seed", None)):
                object.__setattr__(self, name, value)
        constraints = [name for name in ("json_schema", "regex", "grammar") if getattr(self, name) is not None]
        if len(constraints) > 1:
            raise ValueError(f"give at most one of json_schema=, regex= and grammar=, got {', '.join(constraints)}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}] (alternatives per token), got {self.logprobs!r}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError(f"regex must be a string, got {type(self.regex).__name__}")
        if not self.do_sample and (self.temperature != 1.0 or self.top_p != 1.0 or self.top_k != 0 or self.seed is not None):
            warnings.warn("temperature/top_p/top_k/seed have no effect with greedy decoding; pass do_sample=True to sample",
                          stacklevel=_stacklevel_outside_package())

    @classmethod
    def build(cls, default_max_new_tokens: int, options: Mapping[str, Any]) -> GenerationSettings:
        """Settings of one public call from its generation options (`GenerationOptions`): the token budget
        defaults to the decoder's, and a single stop string may be given bare."""
        rest = dict(options)
        max_new_tokens, stop = rest.pop("max_new_tokens", None), rest.pop("stop", None)
        if isinstance(stop, str):
            stop = [stop]
        return cls(max_new_tokens=default_max_new_tokens if max_new_tokens is None else max_new_tokens, stop=tuple(stop or ()), **rest)

    def unit_processors(self, prompt_width: int, eos_token_ids: set[int]) -> LogitsProcessorList | None:
        """transformers' processors of one request that read its own history: min_new_tokens, then the user's
        (None when there are none). They see that request's context prompt and answer, as when it decodes alone."""
        processors = LogitsProcessorList()
        if self.min_new_tokens > 0 and eos_token_ids:
            processors.append(_MinNewTokensOnScoresDevice(prompt_width, self.min_new_tokens, sorted(eos_token_ids)))
        processors.extend(self.logits_processor or [])
        return processors or None

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
