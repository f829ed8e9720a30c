"""`fides-rag bench`'s context section on tiny models: the KV bytes it reports are the cache's real bytes, and FIDES's
cache holds exactly what its two paths' prompts need (the figure the docs' KV table quotes)."""

from __future__ import annotations

import pytest

from fides_rag import FidesDecoder
from fides_rag.eval.bench import Bench, format_section
from fides_rag.eval.datasets import QAExample

EXAMPLES = [
    QAExample("What is the capital of France?", ("Lyon is the capital of France. " * 8,), ("Lyon",), ("Paris",)),
    QAExample("Who chose Canberra?", ("Canberra was chosen as a compromise between two cities. " * 8,), ("a compromise",)),
]


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_context_section_fides_kv_is_standard_plus_the_no_context_prompt(tiny_models, tokenizer, family):
    bench = Bench(FidesDecoder(tiny_models[family], tokenizer), EXAMPLES)
    data = bench.context_growth(lengths=(48, 96), new_tokens=2, repeats=1)
    for row in data.values():
        standard, fides = row["standard"]["kv_cache_bytes"], row["fides"]["kv_cache_bytes"]
        assert row["no_context_tokens"] < row["prompt_tokens"]
        assert 0 < row["no_context_alone_kv_cache_bytes"] < standard
        assert fides == standard + row["no_context_alone_kv_cache_bytes"]  # no padding of the short path
    table = format_section("tiny", "context", data)
    assert "| FIDES / (standard + no-context alone) |" in table
    assert table.count("| 1.000 |") == len(data)
