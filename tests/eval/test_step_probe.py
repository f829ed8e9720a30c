"""The step probe counts the decode steps asked for, times the rest, and changes no token."""

from __future__ import annotations

import contextlib

import pytest
import torch

from fides_rag import FidesDecoder, PromptTemplate
from fides_rag.eval.step_probe import StepProbe, forward_split, measure_engine, measure_generate, prepared_from_ids


@pytest.fixture(scope="module")
def example(tokenizer):
    context = tokenizer("Lyon is the capital of France. Question: What is the capital of France? Answer:")["input_ids"]
    return context, tokenizer("Question: What is the capital of France? Answer:")["input_ids"]


@pytest.mark.parametrize("method", ["standard", "cad", "fides"])
def test_a_measured_engine_decode_counts_its_steps_and_gives_the_unmeasured_tokens(
    tiny_llama, tokenizer, example, method
):
    decoder = FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))
    prepared = prepared_from_ids(tokenizer, *example)
    plain = decoder.generate(prepared, method=method, max_new_tokens=7, min_new_tokens=7)
    outer: list[int] = []
    with decoder.around_steps(lambda: (outer.append(1), contextlib.nullcontext())[1]):
        measured = measure_engine(decoder, prepared, method, new_tokens=7, counted=3)
        assert outer == []  # the probe took the steps
        decoder.generate(prepared, method=method, max_new_tokens=2)
    assert outer  # and gave them back
    assert measured["token_ids"] == plain.token_ids
    assert measured["tokens"] == 7 and measured["counted_steps"] == 3 and measured["timed_steps"] == 3
    assert all(step["ops"] > 50 and step["traffic_bytes"]["total"] > 0 for step in measured["steps"])
    assert measured["decode_ms_per_token"] > 0 and measured["first_token_ms"] > 0
    assert measured["host_syncs_per_token"] is None  # counted on CUDA only


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_the_forwards_timed_are_those_inside_the_timed_steps(tiny_llama, tokenizer, example, mode):
    """Fast mode's last step decodes no token of its own (no mark): its forward lies outside the timed interval and
    is not counted, so a token's forward never takes longer than its step."""
    decoder = FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()), mode=mode)
    measured = measure_engine(decoder, prepared_from_ids(tokenizer, *example), "fides", new_tokens=7, counted=2)
    assert measured["timed_steps"] >= 1
    assert 0 < measured["forward_ms_per_token"] < measured["decode_ms_per_token"]
    assert 0 < measured["forward_share"] < 1


def test_the_forward_split_is_the_window_per_timed_token():
    report = {"timed_steps": 2, "decode_ms_per_token": 4.0}
    assert forward_split([1.0, 3.0], report) == {"forward_ms_per_token": 2.0, "forward_share": 0.5}
    assert forward_split([], report) == {"forward_ms_per_token": None, "forward_share": None}
    assert forward_split([1.0], {"timed_steps": 0, "decode_ms_per_token": None})["forward_share"] is None


@pytest.mark.parametrize("inference_mode", [False, True])
def test_a_measured_generate_gives_standard_decoding_tokens(tiny_llama, tokenizer, example, inference_mode):
    decoder = FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))
    standard = decoder.generate(
        prepared_from_ids(tokenizer, *example), method="standard", max_new_tokens=6, min_new_tokens=6
    )
    measured = measure_generate(tiny_llama, example[0], 6, 2, inference_mode=inference_mode)
    assert measured["token_ids"] == standard.token_ids
    assert measured["counted_steps"] == 2 and measured["timed_steps"] == 3
    assert measured["traffic_bytes_per_token"]["median"] > 0


def test_classifier_free_guidance_is_measured_with_its_negative_prompt(tiny_llama, tokenizer, example):
    measured = measure_generate(tiny_llama, example[0], 5, 2, negative_ids=example[1], guidance_scale=2.0)
    assert len(measured["token_ids"]) == 5 and measured["ops_per_token"] > 0


def test_counted_steps_count_aten_ops_on_the_cpu_and_only_host_syncs_on_cuda():
    """On CUDA a step under a dispatch mode would run eagerly instead of replaying its captured graph: another program
    than the one timed. Counting ops there is opt-in."""
    assert StepProbe(2, torch.device("cpu")).count_ops
    assert not StepProbe(2, torch.device("cuda")).count_ops
    assert StepProbe(2, torch.device("cuda"), count_ops=True).count_ops
