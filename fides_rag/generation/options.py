"""The keyword options of the public calls, as TypedDicts: one typed `**options` shared by the decoder's
`submit`, `generate`, `generate_batch`, `stream`, `agenerate` and `astream`, so editors
complete them and type checkers check them (PEP 692). Each option is declared, with its default, meaning and check,
in `REQUEST_OPTIONS` (`fides_rag.generation.request_options`); the tests hold these keys to it. Validation:
`GenerationSettings` (generation) and `RequestBuilder` (method, methods).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from transformers import LogitsProcessorList, StoppingCriteriaList

from fides_rag.rules.base import ContrastRule

__all__ = ["GenerationOptions", "MethodOptions"]


class GenerationOptions(TypedDict, total=False):
    """Generation keywords of every decoding call; each falls back to `GenerationSettings`' default
    (max_new_tokens to the decoder's)."""

    max_new_tokens: int | None
    stop: Sequence[str] | str | None
    min_new_tokens: int
    do_sample: bool
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    logits_processor: LogitsProcessorList | None
    stopping_criteria: StoppingCriteriaList | None
    json_schema: Any
    regex: str | None
    grammar: Any
    logprobs: int | None


class MethodOptions(GenerationOptions, total=False):
    """`GenerationOptions` plus the contrast rule: `method` (a name, a rule object, or None for the decoder's), or
    `methods` (a list of them, or a mapping label -> method) to decode under several over one shared prefill;
    with `methods` a call returns label -> result(s)."""

    method: str | ContrastRule | None
    methods: Sequence[str | ContrastRule] | Mapping[str, str | ContrastRule] | None
