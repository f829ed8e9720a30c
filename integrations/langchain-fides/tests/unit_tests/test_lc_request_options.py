"""ChatFides' and FidesLLM's fields are the core's request options, with their defaults and descriptions."""

from __future__ import annotations

import pytest

from fides_rag.calls import REQUEST_OPTIONS, options_of
from langchain_fides import ChatFides, FidesLLM


@pytest.mark.parametrize("model", [ChatFides, FidesLLM])
def test_every_adapter_option_is_a_field_with_the_core_default_and_description(model):
    fields = model.model_fields
    for name in set(options_of("fields")) - {"temperature"}:  # temperature: LangChain's default, None
        assert fields[name].default == REQUEST_OPTIONS[name].default, name
        assert fields[name].description == REQUEST_OPTIONS[name].description, name
    assert fields["temperature"].default is None
