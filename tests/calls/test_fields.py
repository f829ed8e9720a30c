"""The decoding fields every framework's FIDES model object inherits: their defaults, their bounds (the decoder's own,
so a bad value fails when the object is made, not at its first sampled call), and fides_config taken only as a
FidesConfig, as the same object."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from fides_rag import FidesConfig
from fides_rag.calls import DecodingFields


def test_defaults_are_greedy_fides_with_the_decoders_constants():
    fields = DecodingFields()
    assert fields.model_dump() == {
        "method": "fides",
        "fides_config": None,
        "max_new_tokens": 128,
        "stop": None,
        "do_sample": False,
        "top_p": 1.0,
        "top_k": 0,
        "seed": None,
        "strict": False,
        "no_context_path": "emptied",
        "max_batch_size": 8,
        "batch_window_s": 0.005,
    }


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_new_tokens", 0),
        ("max_new_tokens", -1),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("max_batch_size", 0),
        ("batch_window_s", -0.001),
        ("batch_window_s", 10.5),
        ("stop", "###"),
    ],
)
def test_a_value_out_of_bounds_is_a_validation_error_naming_its_field(field, value):
    with pytest.raises(ValidationError) as err:
        DecodingFields(**{field: value})
    assert [e["loc"] for e in err.value.errors()] == [(field,)]


@pytest.mark.parametrize(
    "field, value",
    [("max_new_tokens", 1), ("top_p", 1), ("batch_window_s", 0), ("batch_window_s", 10), ("max_batch_size", 1)],
)
def test_the_bounds_themselves_are_accepted(field, value):
    assert getattr(DecodingFields(**{field: value}), field) == value


def test_fides_config_is_kept_as_the_same_object_and_a_dict_is_refused():
    config = FidesConfig(lambda_=2.0)
    assert DecodingFields(fides_config=config).fides_config is config
    for given in (
        {"lambda_": 2.0},
        "calibrated.json",
    ):  # a dict is not built on the source's defaults behind the user's back
        with pytest.raises(
            ValidationError, match=f"fides_config must be a fides_rag.FidesConfig or None, got {type(given).__name__}"
        ):
            DecodingFields(fides_config=given)


def test_the_core_fields_import_no_framework():
    code = (
        "import sys, fides_rag.calls.fields; print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'langchain', 'langchain_core', 'llama_index'}))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )


def test_a_gated_method_is_accepted_and_a_bad_one_refused_when_the_object_is_made():
    assert DecodingFields(method="fides+agree").method == "fides+agree"
    for bad, message in [("standard+agree", "nothing to gate"), ("fides+nope", "available gates: none, agree, nwcad")]:
        with pytest.raises(ValidationError, match=message):
            DecodingFields(method=bad)
