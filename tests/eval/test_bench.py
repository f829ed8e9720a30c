"""`fides-rag bench`'s context section on tiny models: it times standard and FIDES through the decoder as the document
block grows, and its table has one row per length."""

from __future__ import annotations

import pytest

from fides_rag import FidesDecoder
from fides_rag.eval.bench import Bench, format_section
from fides_rag.eval.datasets import QAExample

EXAMPLES = [
    QAExample("What is the capital of France?", ("Lyon is the capital of France. " * 8,), ("Lyon",), ("Paris",)),
    QAExample(
        "Who chose Canberra?", ("Canberra was chosen as a compromise between two cities. " * 8,), ("a compromise",)
    ),
]


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_context_section_times_both_methods_at_each_length(tiny_models, tokenizer, family):
    bench = Bench(FidesDecoder(tiny_models[family], tokenizer), EXAMPLES)
    data = bench.context_growth(lengths=(48, 96), new_tokens=2, repeats=1)
    assert list(data) == ["48", "96"]
    for row in data.values():
        assert row["no_context_tokens"] < row["prompt_tokens"]
        for method in ("standard", "fides"):
            assert row[method]["first_token_ms"] > 0 and row[method]["decode_ms_per_token"] >= 0
    table = format_section("tiny", "context", data)
    assert "| FIDES decode ms/tok |" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and "ms" not in line]
    assert rows == [
        f"| {row['prompt_tokens']} ({row['no_context_tokens']}) | {row['standard']['first_token_ms']:.0f} |"
        f" {row['fides']['first_token_ms']:.0f} | {row['standard']['decode_ms_per_token']:.1f} |"
        f" {row['fides']['decode_ms_per_token']:.1f} |"
        for row in data.values()
    ]
