"""The typed keyword options of the public calls stay in step with the settings they build."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

from fides_rag import FidesDecoder, GenerationOptions, GenerationSettings, MethodOptions


def test_generation_options_name_every_setting():
    assert GenerationOptions.__optional_keys__ == {f.name for f in dataclasses.fields(GenerationSettings)}
    assert GenerationOptions.__required_keys__ == frozenset()


def test_each_options_type_adds_its_own_keys():
    assert MethodOptions.__optional_keys__ - GenerationOptions.__optional_keys__ == {"method", "methods"}


@pytest.mark.parametrize(
    "call, options",
    [
        (FidesDecoder.generate, MethodOptions),
        (FidesDecoder.generate_batch, MethodOptions),
        (FidesDecoder.stream, MethodOptions),
        (FidesDecoder.agenerate, MethodOptions),
        (FidesDecoder.astream, MethodOptions),
        (FidesDecoder.submit, MethodOptions),
    ],
)
def test_public_calls_declare_their_options(call, options):
    hints = typing.get_type_hints(call, include_extras=True)  # resolves: no name is missing at run time
    keywords = [p for p in inspect.signature(call).parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert len(keywords) == 1
    assert typing.get_args(hints[keywords[0].name]) == (options,)


def test_every_option_is_accepted_and_an_unknown_one_is_named(tiny_llama, tokenizer):
    tiny_decoder = FidesDecoder(tiny_llama, tokenizer)
    options: MethodOptions = {
        "method": "cad",
        "max_new_tokens": 2,
        "stop": ["\n"],
        "min_new_tokens": 1,
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "seed": 3,
        "logits_processor": None,
        "stopping_criteria": None,
        "logprobs": 2,
    }
    # methods= is the other way to name the rule; json_schema=, regex= and grammar= exclude each other (tested apart)
    options["json_schema"] = {"type": "string", "maxLength": 2}
    assert set(options) == MethodOptions.__optional_keys__ - {"methods", "regex", "grammar"}
    first = tiny_decoder.generate("q?", ["a document"], **options)
    assert first.token_ids == tiny_decoder.generate("q?", ["a document"], **options).token_ids  # the seed is used
    assert 1 <= len(first.token_ids) <= 2 and all(len(step.top_logprobs) <= 2 for step in first.steps)
    with pytest.raises(TypeError, match="temprature"):
        tiny_decoder.generate("q?", ["a document"], temprature=0.5)


def test_methods_is_one_option_that_returns_results_by_label(tiny_llama, tokenizer):
    tiny_decoder = FidesDecoder(tiny_llama, tokenizer)
    one = tiny_decoder.generate("q?", ["a document"], method="cad", max_new_tokens=3)
    by_label = tiny_decoder.generate("q?", ["a document"], methods=["cad"], max_new_tokens=3)
    assert list(by_label) == ["cad"] and by_label["cad"].token_ids == one.token_ids
    with pytest.raises(ValueError, match="method= or methods=, not both"):
        tiny_decoder.generate("q?", ["a document"], method="cad", methods=["fides"])
    with pytest.raises(ValueError, match="a stream decodes one method"):
        tiny_decoder.stream("q?", ["a document"], methods=["cad", "fides"])
