"""Switching a config's attention implementation for one engine call: the name reads back inside, the previous one
after (even on error), and a config with sub-configs switches them too, as transformers' setter does."""

from __future__ import annotations

import pytest
from transformers import Gemma3Config, LlamaConfig

from fides_rag.generation.engine.attention.implementation import attention_implementation


def test_a_text_config_reads_the_switched_name_inside_and_its_own_after():
    config = LlamaConfig()
    config._attn_implementation = "sdpa"
    with attention_implementation(config, "fides_pool_gather"):
        assert config._attn_implementation == "fides_pool_gather"
    assert config._attn_implementation == "sdpa"


def test_the_previous_implementation_is_back_after_an_error():
    config = LlamaConfig()
    config._attn_implementation = "eager"
    with pytest.raises(RuntimeError), attention_implementation(config, "fides_pool_gather"):
        raise RuntimeError("the step failed")
    assert config._attn_implementation == "eager"


def test_a_config_with_sub_configs_switches_them_through_transformers_setter():
    config = Gemma3Config()
    config._attn_implementation = "sdpa"
    with attention_implementation(config, "fides_pool_gather"):
        assert config._attn_implementation == "fides_pool_gather"
        assert config.text_config._attn_implementation == "fides_pool_gather"
    assert config.text_config._attn_implementation == "sdpa"
