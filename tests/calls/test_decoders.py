"""The decoder behind every front door, built once: a FidesDecoder as given, or one of a model and its tokenizer;
bad input refused as a TypeError (and a ValueError, for pydantic validators); defaults checked when a model object is
made; the decoder's identity as a cache key sees it."""

from __future__ import annotations

import pytest

from fides_rag import FidesConfig, FidesDecoder
from fides_rag.calls.decoders import DecoderInputError, check_defaults, decoder_for, decoder_identity


def test_a_decoder_is_taken_as_given_or_built_from_a_model_and_its_tokenizer(tiny_llama, chat_tokenizer):
    built = decoder_for(model=tiny_llama, tokenizer=chat_tokenizer, max_new_tokens=5, config=FidesConfig(lambda_=0.3))
    assert isinstance(built, FidesDecoder) and built.max_new_tokens == 5 and built.method.config.lambda_ == 0.3
    assert decoder_for(built) is built


@pytest.mark.parametrize("given", [{}, {"decoder": "gemma3-270m"}, {"model": object()}])
def test_what_cannot_make_a_decoder_is_refused_naming_the_decoder(given):
    with pytest.raises(DecoderInputError, match="FidesDecoder") as err:
        decoder_for(**given)
    assert isinstance(err.value, TypeError) and isinstance(err.value, ValueError)


def test_a_decoder_and_a_model_together_are_refused(tiny_llama, chat_tokenizer):
    decoder = FidesDecoder(tiny_llama, chat_tokenizer)
    with pytest.raises(DecoderInputError, match="not both"):
        decoder_for(decoder, model=tiny_llama, tokenizer=chat_tokenizer)


@pytest.mark.parametrize(
    "method, path, config, match",
    [
        ("nope", "emptied", None, "unknown method"),
        ("fides", "nowhere", None, "no_context_path"),
        ("fides", "emptied", {"lambda_": 0.3}, "fides_config must be a fides_rag.FidesConfig"),
    ],
)
def test_bad_defaults_fail_when_a_model_object_is_made(method, path, config, match):
    with pytest.raises(ValueError, match=match):
        check_defaults(method, path, config)
    check_defaults("fides", "question", FidesConfig())


def test_the_identity_tells_models_and_templates_apart(tiny_llama, chat_tokenizer):
    one, two = FidesDecoder(tiny_llama, chat_tokenizer), FidesDecoder(tiny_llama, chat_tokenizer)
    assert decoder_identity(one) == decoder_identity(two)
    other = decoder_identity(FidesDecoder(tiny_llama, chat_tokenizer, config=FidesConfig(lambda_=0.3)))
    assert (
        other["decoder_config"] != decoder_identity(one)["decoder_config"]
        and other["model"] == decoder_identity(one)["model"]
    )
