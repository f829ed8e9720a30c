"""The engine's modes: fast mode (one attention call per layer over a pooled KV cache) gives exact mode's tokens on
the tiny models, for every method and gate, with requests joining and leaving and the pool growing; bad modes and
models fast mode cannot run are refused when the decoder is built, naming what is accepted."""

from __future__ import annotations

import pytest
import torch

from fides_rag import FidesDecoder, PromptTemplate, available_methods, get_method
from fides_rag.generation.engine.modes import resolve_mode

QUESTIONS = [
    "What is the capital of France?",
    "Who chose Canberra?",
    "What jumps?",
    "Which city is the capital of Australia?",
    "Where is the Seine?",
    "Who was chosen?",
]
DOCUMENTS = [
    ["Lyon is the capital of France.", "Paris is a large city on the Seine."],
    ["The capital of Australia is Melbourne.", "Canberra was chosen as a compromise."],
    ["The quick brown fox jumps over the lazy dog.", "Lyon."],
    ["Canberra was chosen.", "The capital of Australia is Melbourne. " * 3],
    ["The Seine flows through Paris. " * 6, "Rivers."],
    ["A compromise was chosen. " * 9, "Nobody."],
]
RULES = {name: {"decore": dict(heads={1: [0], 3: [1, 2]})}.get(name, {}) for name in available_methods()}
RULES.update({"fides+agree": {}, "cad+nwcad": {}})


def decoders(model, tokenizer):
    template = PromptTemplate(stop=())
    return (
        FidesDecoder(model, tokenizer, prompt_template=template, mode="exact"),
        FidesDecoder(model, tokenizer, prompt_template=template, mode="fast"),
    )


def assert_same(exact, fast):
    assert fast.token_ids == exact.token_ids and fast.finish_reason == exact.finish_reason
    for x, y in zip(exact.steps, fast.steps):
        for name in x.values:
            assert y.values[name] == pytest.approx(x.values[name], abs=1e-4), name


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("name", list(RULES))
def test_fast_mode_in_flight_gives_exact_modes_tokens_alone(tiny_models, tokenizer, family, name):
    exact, fast = decoders(tiny_models[family], tokenizer)
    rule = get_method(name, **RULES[name])
    budgets = [3, 9, 5, 12, 7, 10]  # rows leave at different steps while others decode
    alone = [exact.generate(q, d, method=rule, max_new_tokens=n) for q, d, n in zip(QUESTIONS, DOCUMENTS, budgets)]
    handles = [fast.submit(q, d, method=rule, max_new_tokens=n) for q, d, n in zip(QUESTIONS, DOCUMENTS, budgets)]
    for expected, handle in zip(alone, handles):
        assert_same(expected, handle.result())


def test_fast_mode_gives_each_method_of_a_request_its_own_copy_of_the_shared_rows(tiny_llama, tokenizer):
    exact, fast = decoders(tiny_llama, tokenizer)
    methods = ["standard", "cad", "fides", "adacad"]
    expected = exact.generate_batch(QUESTIONS, DOCUMENTS, methods=methods, max_new_tokens=8)
    got = fast.generate_batch(QUESTIONS, DOCUMENTS, methods=methods, max_new_tokens=8)
    for label in expected:
        for a, b in zip(expected[label], got[label]):
            assert_same(a, b)


def test_fast_mode_grows_its_pool_while_requests_decode(tiny_llama, tokenizer):
    exact, fast = decoders(tiny_llama, tokenizer)
    long_documents = [[d[0] * 12, d[1] * 12] for d in DOCUMENTS]  # about 2,000 positions in flight: the pool doubles
    expected = [exact.generate(q, d, method="fides", max_new_tokens=6) for q, d in zip(QUESTIONS, long_documents)]
    got = [
        h.result()
        for h in [fast.submit(q, d, method="fides", max_new_tokens=6) for q, d in zip(QUESTIONS, long_documents)]
    ]
    for a, b in zip(expected, got):
        assert_same(a, b)


def test_an_unknown_mode_is_refused_naming_the_modes(tiny_llama, tokenizer):
    with pytest.raises(ValueError, match=r"mode must be one of \['exact', 'fast'\].*'quick'"):
        FidesDecoder(tiny_llama, tokenizer, mode="quick")


def test_fast_mode_refuses_soft_capped_attention(tiny_models, tokenizer):
    with pytest.raises(ValueError, match="mode='fast' cannot run this model: its attention logits are soft-capped"):
        FidesDecoder(tiny_models["gemma2"], tokenizer, mode="fast")


def test_exact_mode_is_refused_on_an_accelerator_and_is_the_cpus_default(tiny_llama, tokenizer):
    with pytest.raises(ValueError, match="mode='exact' needs batch-invariant .* on cuda use mode='fast'"):
        resolve_mode("exact", torch.device("cuda"), tiny_llama.config)
    assert resolve_mode(None, torch.device("cpu"), tiny_llama.config) == "exact"
    assert FidesDecoder(tiny_llama, tokenizer).limits.mode == "exact"
    assert FidesDecoder(tiny_llama, tokenizer, mode="fast").limits.mode == "fast"
    assert resolve_mode(None, torch.device("cuda"), tiny_llama.config) == "fast"
