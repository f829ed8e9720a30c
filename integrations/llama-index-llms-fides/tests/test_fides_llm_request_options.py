"""FidesLLM's fields and per-call keywords are the core's request options, with their defaults and descriptions."""

from __future__ import annotations

from llama_index.llms.fides import CALL_OPTIONS, FidesLLM

from fides_rag.calls import REQUEST_OPTIONS, options_of


def test_every_adapter_option_is_a_field_with_the_core_default_and_description():
    fields = FidesLLM.model_fields
    for name in set(options_of("fields")) - {"temperature"}:  # temperature: LlamaIndex's default, 1.0
        assert fields[name].default == REQUEST_OPTIONS[name].default, name
        assert fields[name].description == REQUEST_OPTIONS[name].description, name
    assert fields["temperature"].default == 1.0


def test_every_call_option_of_the_core_is_a_keyword_of_a_call():
    assert set(options_of("call")) <= set(CALL_OPTIONS)
