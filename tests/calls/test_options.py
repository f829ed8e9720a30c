"""One call's options, parsed once for every front door: the registry checks the method, one FidesFallbackError."""

from __future__ import annotations

import logging

import pytest

from fides_rag import FidesConfig
from fides_rag.calls import CallInputError, CallOptions, ChatPlan, FidesFallbackError, fold_fides_constants
from fides_rag.calls.options import plain_options, split_template_args


def test_a_call_overrides_the_defaults_and_config_goes_to_the_rules_that_take_one():
    config = FidesConfig(lambda_=0.3)
    opts = CallOptions.parse(
        {"method": "fides", "fides_config": config, "max_new_tokens": 64, "stop": ["\n\n"]},
        {"max_new_tokens": 5, "stop": ["END", "\n\n"], "temperature": 0.7, "do_sample": True, "seed": 1},
    )
    assert opts.method.config == config and opts.requested == "fides" and opts.max_new_tokens == 5
    assert opts.stop == ["END", "\n\n"] and opts.sampling["temperature"] == 0.7 and opts.sampling["seed"] == 1
    cad = CallOptions.parse({"method": "fides", "fides_config": config}, {"method": "cad"})
    assert cad.method == "cad" and cad.requested == "cad" and cad.sampling == {}  # greedy: no sampling keywords


@pytest.mark.parametrize(
    "call, field",
    [
        ({"method": "no-such-method"}, "method"),
        ({"method": "cad", "fides_config": FidesConfig()}, "fides_config"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"json_schema": {"type": "object"}, "regex": "a+"}, "json_schema"),
        ({"seed": 2**64}, "seed"),  # greedy: the seed is unused, and still checked
        ({"seed": -1, "do_sample": True, "temperature": 0.5}, "seed"),
        ({"seed": 2**63, "temperature": 0}, "seed"),
    ],
)
def test_bad_options_name_their_field(call, field):
    with pytest.raises(CallInputError) as err:
        CallOptions.parse({"method": "fides"}, call)
    assert err.value.field == field and isinstance(err.value, ValueError)


def test_unknown_keywords_are_refused_never_dropped():
    with pytest.raises(TypeError, match="strict must be True or False"):
        CallOptions.parse({}, {"strict": "yes"})
    with pytest.raises(TypeError, match=r"unsupported call options \['include_raw'\]"):
        CallOptions.parse({}, {"include_raw": True})
    assert CallOptions.parse({}, {"documents": ["x"]}, allowed=("documents",)).requested == "fides"


def test_one_fallback_check(caplog):
    plan = ChatPlan("prompts", "none").fall_back("no documents were given", "decoded with 'standard'")
    with pytest.raises(
        FidesFallbackError, match="strict=True: no documents were given, so method 'fides' has nothing to contrast"
    ):
        CallOptions.parse({"strict": True}, {}).check_fallback(plan)
    CallOptions.parse({"strict": True}, {"method": "standard"}).check_fallback(plan)  # standard loses nothing
    with caplog.at_level(logging.WARNING, logger="fides_rag.calls"):
        CallOptions.parse({}, {}).check_fallback(plan)
    assert "no documents were given: decoded with 'standard'" in caplog.text


def test_fides_constants_given_by_name_become_one_config():
    kwargs = {"weights": [0.2, 0.3, 0.5], "lambda_": 0.4, "method": "fides"}
    fold_fides_constants(kwargs, FidesConfig())
    assert kwargs == {"method": "fides", "fides_config": FidesConfig(weights=(0.2, 0.3, 0.5), lambda_=0.4)}
    untouched = {"method": "cad"}
    fold_fides_constants(untouched, FidesConfig())
    assert untouched == {"method": "cad"}
    with pytest.raises(TypeError, match="not both"):
        fold_fides_constants({"lambda_": 0.4, "fides_config": FidesConfig()}, FidesConfig())


def test_plain_options_are_a_cache_key_of_plain_values():
    class Doc:
        page_content = "Rome."

    plain = plain_options(
        {"method": "cad", "documents": [Doc(), "Paris."], "fides_config": FidesConfig(), "ls_provider": "x"}
    )
    assert list(plain) == ["documents", "fides_config", "method"] and plain["documents"] == ["Rome.", "Paris."]
    assert (
        plain["fides_config"] == repr(FidesConfig())
        and plain_options({"documents": {"a": 1}})["documents"] == "{'a': 1}"
    )


def test_a_template_variable_is_never_taken_for_an_option():
    variables, call = split_template_args(
        {"query_str": "Q", "method": "cad", "max_new_tokens": 4},
        ["query_str", "max_new_tokens"],
        ["method", "max_new_tokens"],
    )
    assert variables == {"query_str": "Q", "max_new_tokens": 4} and call == {"method": "cad"}
