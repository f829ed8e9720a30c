"""The keyword options of the decoder's public calls, as TypedDicts: one typed `**options` shared by `generate`,
`generate_batch`, `generate_from_prompts`, `stream` and the rest, so editors complete them and type checkers
check them (PEP 692), and a new option is added in one place. Their meaning and validation: `GenerationSettings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from transformers import LogitsProcessorList, StoppingCriteriaList

from fides_rag.rules.base import ContrastRule

__all__ = ["GenerationOptions", "MethodOptions", "RawPromptOptions", "RequestOptions"]


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


class MethodOptions(GenerationOptions, total=False):
    """`GenerationOptions` plus the contrast rule of a one-method call (a name, a rule object, or None for the decoder's)."""

    method: str | ContrastRule | None


class RawPromptOptions(MethodOptions, total=False):
    """`MethodOptions` plus, for two raw prompt strings, whether the tokenizer adds its special tokens (BOS)."""

    add_special_tokens: bool


class RequestOptions(RawPromptOptions, total=False):
    """A batched request's options (`RequestBatcher.submit`): `MethodOptions`, or for raw prompts
    context_prompt and no_context_prompt (and add_special_tokens) in place of a question and documents."""

    context_prompt: str | None
    no_context_prompt: str | None
    untrusted_texts: Sequence[str]
    """With raw prompts: texts in them (the documents, the question) tokenised as plain text, so that special-token
    text inside them never becomes a control token (fides-rag's own template always does this)."""
