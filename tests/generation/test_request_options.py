"""The request options are declared once: the decoder's typed options, the generation settings, a framework call's
options, the adapters' fields and the server's request fields all carry them with the same defaults, bounds and
error texts, so they cannot drift apart."""

from __future__ import annotations

import dataclasses

import annotated_types
import pytest

from fides_rag import GenerationSettings, MethodOptions
from fides_rag.calls import CallInputError, CallOptions, DecodingFields
from fides_rag.calls.options import OPTIONS
from fides_rag.generation.request_options import REQUEST_OPTIONS, option_field, options_of
from fides_rag.serve.protocol import ChatCompletionRequest, CompletionRequest

ADAPTER_OWN_FIELDS = {"max_batch_size", "batch_window_s"}
"""How a model object batches its concurrent calls: set once when it is made, not per request."""
OPENAI_TEMPERATURE = "temperature"
"""The server's temperature is OpenAI's (0 to 2, 0 greedy), not the sampler's."""


def _bounds(field) -> dict:
    """A pydantic field's numeric bounds as {"gt": ..., "ge": ..., ...}."""
    found = {}
    for item in field.metadata:
        for name in ("gt", "ge", "lt", "le"):
            if isinstance(item, getattr(annotated_types, name.capitalize())):
                found[name] = getattr(item, name)
    return found


def test_the_decoders_typed_options_are_exactly_its_request_options():
    assert MethodOptions.__optional_keys__ == set(options_of("decoder"))


def test_the_generation_settings_take_every_decoder_option_with_its_default():
    settings = {f.name: f.default for f in dataclasses.fields(GenerationSettings)}
    assert set(settings) == set(options_of("decoder")) - {"method", "methods"}
    for name, default in settings.items():
        expected = REQUEST_OPTIONS[name].default
        assert default == (() if name == "stop" and expected is None else expected), name


def test_a_framework_call_takes_exactly_its_request_options_with_their_defaults():
    assert set(options_of("call")) == OPTIONS
    parsed = CallOptions.parse({}, {})
    assert parsed.requested == REQUEST_OPTIONS["method"].default
    assert parsed.max_new_tokens == REQUEST_OPTIONS["max_new_tokens"].default
    assert parsed.strict is REQUEST_OPTIONS["strict"].default and parsed.stop == [] and parsed.sampling == {}


def test_the_adapters_fields_are_the_request_options_with_their_defaults_and_bounds():
    fields = DecodingFields.model_fields
    assert set(fields) - ADAPTER_OWN_FIELDS == set(options_of("fields")) - {
        "temperature"
    }  # temperature: each adapter's own
    for name in set(fields) - ADAPTER_OWN_FIELDS:
        option = REQUEST_OPTIONS[name]
        assert fields[name].default == option.default, name
        assert _bounds(fields[name]) == dict(option.bounds), name
        assert fields[name].description == option.description, name


def test_the_servers_fields_are_the_request_options_under_their_http_names():
    server = {
        **ChatCompletionRequest.model_fields,
        **CompletionRequest.model_fields,
    }  # chat's logprobs is OpenAI's flag
    for name in options_of("server"):
        option = REQUEST_OPTIONS[name]
        assert option.over_http in server, name
        field = server[option.over_http]
        assert field.default is None, name  # unset: the server's own default
        if option.over_http != "response_format" and name != OPENAI_TEMPERATURE:
            assert _bounds(field) == dict(option.bounds), name
    chat = ChatCompletionRequest.model_fields
    assert _bounds(chat["max_completion_tokens"]) == dict(REQUEST_OPTIONS["max_new_tokens"].bounds)
    assert _bounds(chat["top_logprobs"]) == dict(REQUEST_OPTIONS["logprobs"].bounds)


@pytest.mark.parametrize("name, value", [("max_new_tokens", 0), ("seed", 2**64), ("seed", -1)])
def test_a_bad_value_gets_the_same_error_text_in_every_front_door(name, value):
    message = REQUEST_OPTIONS[name].error(value)
    with pytest.raises(ValueError) as settings_error:
        GenerationSettings(**{name: value})
    with pytest.raises(CallInputError) as call_error:
        CallOptions.parse({}, {name: value})
    assert str(settings_error.value) == str(call_error.value) == message and call_error.value.field == name


def test_a_field_made_from_an_option_can_override_any_of_its_parts():
    field = option_field("top_p", default=None, description="mine")
    assert field.default is None and field.description == "mine"
    assert _bounds(field) == {"gt": 0, "le": 1}
