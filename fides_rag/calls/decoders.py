"""The decoder behind a front door, built once for every front door from what it was given (a ready FidesDecoder, a
model and its tokenizer, or a model id to load), the checks of a front door's default options, and the decoder's
identity as a framework's cache key sees it."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from fides_rag.calls.fields import check_fides_config
from fides_rag.calls.options import resolve_method
from fides_rag.decoder import FidesDecoder
from fides_rag.errors import DecoderInputError
from fides_rag.method.config import FidesConfig
from fides_rag.models.loading import load_model
from fides_rag.prompts.raw import check_no_context_path

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from fides_rag.rules import ContrastRule


def decoder_for(
    decoder: FidesDecoder | None = None,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_id: str | None = None,
    method: str = "fides",
    max_new_tokens: int = 128,
    config: FidesConfig | None = None,
    device: str = "auto",
    dtype: torch.dtype | str | None = None,
) -> FidesDecoder:
    """`decoder` as given (it must be a FidesDecoder, and comes without `model`/`tokenizer`), else a FidesDecoder of
    `model` and `tokenizer`, else of `model_id` loaded (cached by `load_model`) on `device` in `dtype`."""
    if decoder is not None:
        if not isinstance(decoder, FidesDecoder):
            raise DecoderInputError(f"decoder must be a FidesDecoder, got {type(decoder).__name__}")
        if model is not None or tokenizer is not None:
            raise DecoderInputError("pass either a FidesDecoder (decoder=) or model= and tokenizer=, not both")
        return decoder
    if model is None or tokenizer is None:
        if model_id is None:
            raise DecoderInputError(
                "give a FidesDecoder (decoder=), both model= and tokenizer=, or a model id to load (from_model_id)"
            )
        model, tokenizer = load_model(model_id, device=device, dtype=dtype)
    return FidesDecoder(model, tokenizer, method=method, config=config, max_new_tokens=max_new_tokens)


def check_defaults(method: str | ContrastRule, no_context_path: str = "emptied", fides_config: object = None) -> None:
    """A front door's default options checked when it is made, not at its first call (a ValueError naming the option):
    the method known to the registry, the no-context design, the FIDES constants a FidesConfig or None."""
    resolve_method(method)
    check_no_context_path(no_context_path)
    check_fides_config(fides_config)


def decoder_identity(decoder: FidesDecoder) -> dict[str, Any]:
    """What about the decoder changes its answers, as plain values (a framework's cache key and traces): the model,
    the FIDES constants, fides-rag's template and whether prompts go through the chat template. A model without a
    name (built in memory) is told apart by its object, so no cache entry is shared across models."""
    model = decoder.model
    return {
        "model": f"{type(model).__name__}:{getattr(model, 'name_or_path', '') or f'object-{id(model)}'}",
        "decoder_config": repr(getattr(decoder.method, "config", None)),
        "decoder_prompt_template": hashlib.sha256(repr(decoder.prompts.template).encode()).hexdigest()[:16],
        "decoder_use_chat_template": decoder.prompts.use_chat_template,
    }
