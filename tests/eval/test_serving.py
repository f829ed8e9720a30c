"""The serving benchmark runs all three modes on one arrival schedule and finds the same greedy outputs."""

from __future__ import annotations

from fides_rag import FidesDecoder
from fides_rag.eval.datasets import QAExample
from fides_rag.eval.serving import format_serving, serving


def test_serving_modes_agree_and_report_latencies(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    examples = [
        QAExample(question=q, contexts=(d,), context_answers=("x",), id=str(i))
        for i, (q, d) in enumerate(
            [("What is the capital?", "Lyon is the capital of France."), ("Who chose it?", "Canberra was chosen.")]
        )
    ]
    report = serving(decoder, examples, loads=(2.0,), n_requests=5, tokens=(2, 6))
    entry = report["loads"]["2.0"]
    assert entry["identical_outputs"]
    for mode in ("continuous", "static", "sequential"):
        d = entry["modes"][mode]
        assert 0 <= d["ttft_s"]["p50"] <= d["latency_s"]["p95"]
        assert d["examples_per_s"] > 0 and all(2 <= n <= 6 for n in d["tokens"])
    assert entry["modes"]["sequential"]["tokens"] == entry["modes"]["continuous"]["tokens"]
    assert decoder.limits.admission == "continuous" and decoder.limits.max_requests is None  # restored
    assert "| 2.0x | continuous |" in format_serving(report)


def test_serving_runs_under_the_step_budget_it_is_given_and_keeps_the_outputs(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    examples = [
        QAExample(
            question="What is the capital?",
            contexts=("Lyon is the capital of France. " * 8,),
            context_answers=("x",),
            id="0",
        )
    ]
    report = serving(decoder, examples, loads=(2.0,), n_requests=4, tokens=(2, 4), max_num_batched_tokens=16)
    assert report["max_num_batched_tokens"] == decoder.limits.max_num_batched_tokens == 16
    assert report["loads"]["2.0"]["identical_outputs"]
    assert "steps of at most 16 tokens" in format_serving(report)


def test_a_capped_continuous_run_decodes_at_most_the_cap_at_once_and_keeps_the_outputs(tiny_llama, tokenizer):
    from fides_rag.eval.serving import ServingBench

    examples = [
        QAExample(
            question="What is the capital?",
            contexts=("Lyon is the capital of France.",),
            context_answers=("x",),
            id="0",
        )
    ]
    free, capped = FidesDecoder(tiny_llama, tokenizer), FidesDecoder(tiny_llama, tokenizer)
    uncapped_run = ServingBench(free, examples, n_requests=5, tokens=(2, 6)).run("continuous", 1000.0)
    bench = ServingBench(capped, examples, n_requests=5, tokens=(2, 6))
    capped_run = bench.run("continuous", 1000.0, max_requests=2)
    assert capped.limits.max_requests == 2 and 1 <= capped.stats.largest_batch <= 2
    assert capped_run["token_ids"] == uncapped_run["token_ids"]
    bench.configure("continuous")
    assert capped.limits.max_requests is None
