"""The step-budget sweep serves one schedule under each budget, reports each, and restores the engine."""

from __future__ import annotations

import pytest

import fides_rag.cli.main as cli
from fides_rag import FidesDecoder
from fides_rag.eval.budget_sweep import budget_sweep, format_budget_sweep
from fides_rag.eval.datasets import QAExample


@pytest.fixture
def examples():
    return [
        QAExample(
            question="What is the capital?",
            contexts=("Lyon is the capital of France. " * 8,),
            context_answers=("x",),
            id="0",
        ),
        QAExample(question="Who chose it?", contexts=("Canberra was chosen. " * 6,), context_answers=("y",), id="1"),
    ]


def test_every_budget_serves_the_whole_schedule_and_the_engine_gets_its_budget_back(tiny_llama, tokenizer, examples):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    default = decoder.limits.max_num_batched_tokens
    report = budget_sweep(decoder, examples, budgets=(16, 64), load=2.0, n_requests=4, tokens=(2, 4))
    assert list(report["budgets"]) == ["16", "64"] and report["default"] == default
    assert isinstance(report["identical_outputs"], bool)
    assert report["best"] in (16, 64)
    for d in report["budgets"].values():
        assert 0 < d["ttft_s"]["p50"] <= d["latency_s"]["p95"] and d["examples_per_s"] > 0
        assert d["prefill"]["prompt_tokens_per_request"] > 0 and all(2 <= n <= 4 for n in d["tokens"])
    assert decoder.limits.max_num_batched_tokens == default
    assert decoder.limits.admission == "continuous" and decoder.limits.max_requests is None
    table = format_budget_sweep(report)
    assert "| 16" in table and "| 64" in table and "(lowest p95)" in table


@pytest.mark.parametrize("budgets", [(), (8,), (0, 64)])
def test_a_budget_below_the_smallest_chunk_or_none_is_refused_before_any_work(tiny_llama, tokenizer, examples, budgets):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    with pytest.raises(ValueError, match="budget|batched_tokens"):
        budget_sweep(decoder, examples, budgets=budgets, n_requests=4, tokens=(2, 4))
    assert decoder.stats.prompt_tokens == 0


@pytest.mark.parametrize("value", ["8,64", "abc", ","])
def test_bench_rejects_budgets_it_cannot_sweep(value, capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--sections", "budget", "--budgets", value])
    assert "--budgets" in capsys.readouterr().err
