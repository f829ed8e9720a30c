"""Chunked prefill under a token budget: prompts longer than the budget are prefilled over several steps, and
every method and path kind (full and sliding-window layers, the logit lens, masked heads, per-document rows)
gives its solo tokens and values whatever else is in flight."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fides_rag import FidesDecoder, PromptTemplate, available_methods, get_method
from fides_rag.generation.engine.prefix_cache import PrefixCache
from fides_rag.testing import MULTI_DOCUMENT_QUESTIONS, MULTI_DOCUMENTS, SAMPLE_DOCUMENTS, SAMPLE_QUESTIONS

QUESTIONS = [*MULTI_DOCUMENT_QUESTIONS, SAMPLE_QUESTIONS[1]]
DOCUMENTS = [*MULTI_DOCUMENTS, SAMPLE_DOCUMENTS[1]]
RULES = {name: {"decore": dict(heads={1: [0], 3: [1, 2]})}.get(name, {}) for name in available_methods()}


def same(a, b):
    assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
    assert [s.values for s in a.steps] == [s.values for s in b.steps]


def close(a, b):
    assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
    for x, y in zip(a.steps, b.steps):
        assert x.values == pytest.approx(y.values, abs=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_every_method_submitted_at_once_gives_its_solo_result_under_a_small_budget(tiny_models, tokenizer, family):
    """16-token chunks: every prompt takes several steps; requests prefill while others decode (gemma3: a
    16-token sliding window, so chunks cross the window)."""
    decoder = FidesDecoder(
        tiny_models[family], tokenizer, prompt_template=PromptTemplate(stop=()), max_num_batched_tokens=16
    )
    requests, alone = {}, {}
    for i, (name, options) in enumerate(RULES.items()):
        q, docs, budget = QUESTIONS[i % 4], DOCUMENTS[i % 4], (5, 11, 3, 8)[i % 4]
        requests[name] = (q, docs, dict(method=get_method(name, **options), max_new_tokens=budget))
        alone[name] = decoder.generate(q, docs, method=get_method(name, **options), max_new_tokens=budget)
    assert decoder.stats.prompt_tokens > 16 * len(RULES)
    handles = [decoder.submit(q, docs, **options) for q, docs, options in requests.values()]
    for name, handle in zip(requests, handles):
        close(handle.result(), alone[name])


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_prefix_cache_on_and_off_give_identical_tokens_and_values_for_every_method(tiny_models, tokenizer, family):
    on = FidesDecoder(
        tiny_models[family], tokenizer, prompt_template=PromptTemplate(stop=()), max_num_batched_tokens=32
    )
    off = FidesDecoder(
        tiny_models[family],
        tokenizer,
        prompt_template=PromptTemplate(stop=()),
        max_num_batched_tokens=32,
        prefix_caching=False,
    )
    for i, (name, options) in enumerate(RULES.items()):
        q, docs = QUESTIONS[i % 4], DOCUMENTS[i % 4]
        same(
            on.generate(q, docs, method=get_method(name, **options), max_new_tokens=6),
            off.generate(q, docs, method=get_method(name, **options), max_new_tokens=6),
        )
    cached, uncached = on.stats, off.stats
    assert cached.prefix_cache_hits > len(RULES) and cached.prefill_tokens < uncached.prefill_tokens
    assert cached.prompt_tokens == uncached.prompt_tokens
    assert uncached.prefix_cache_hits == 0 and uncached.prefix_cache_entries == 0


def test_the_prefix_cache_stays_within_its_bytes(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer, prefix_cache_bytes=150_000)
    for q, docs in zip(QUESTIONS, DOCUMENTS):
        decoder.generate(q, docs, max_new_tokens=2)
    stats = decoder.stats
    assert 0 < stats.prefix_cache_bytes <= 150_000 and stats.prefix_cache_evictions > 0


def test_a_prefix_cache_of_zero_bytes_is_off(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer, prefix_cache_bytes=0)
    for q, docs in zip(QUESTIONS, DOCUMENTS):
        decoder.generate(q, docs, max_new_tokens=2)
    stats = decoder.stats
    assert stats.prefix_cache_entries == 0 and stats.prefix_cache_hits == 0 and decoder.limits.prefix_cache_bytes == 0
    assert stats.prefill_tokens == stats.prompt_tokens


def test_a_model_or_tokenizer_change_empties_the_prefix_cache(tiny_models, tokenizer, chat_tokenizer):
    cache = PrefixCache(block_size=4)
    layer = SimpleNamespace(keys=torch.zeros(1, 2, 4, 4), values=torch.zeros(1, 2, 4, 4))
    tokens, cuts = [1, 2, 3, 4, 5, 6], [4]
    cache.bind(tiny_models["llama"], tokenizer)
    cache.store(tokens, cuts, (), (0, 4), [layer])
    cache.bind(tiny_models["llama"], tokenizer)
    assert len(cache) == 1 and cache.lookup(tokens, cuts, ())[0] == 4  # the same model and tokenizer keep it
    cache.bind(tiny_models["mistral"], tokenizer)
    assert len(cache) == 0 and cache.bytes == 0
    cache.store(tokens, cuts, (), (0, 4), [layer])
    cache.bind(tiny_models["mistral"], chat_tokenizer)
    assert len(cache) == 0


@pytest.mark.parametrize("budget", [0, -5, 15, 2.5, True, "64"])
def test_a_budget_below_one_chunk_is_refused_at_start(tiny_llama, tokenizer, budget):
    with pytest.raises(ValueError, match="max_num_batched_tokens must be an integer >= 16"):
        FidesDecoder(tiny_llama, tokenizer, max_num_batched_tokens=budget)
    decoder = FidesDecoder(tiny_llama, tokenizer)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        decoder.configure(max_num_batched_tokens=budget)


@pytest.mark.parametrize("size", [-1, 1.5, True])
def test_a_bad_prefix_cache_size_is_refused(tiny_llama, tokenizer, size):
    with pytest.raises(ValueError, match="prefix cache size"):
        FidesDecoder(tiny_llama, tokenizer, prefix_cache_bytes=size)


def test_a_prompt_past_the_models_context_is_refused_before_it_is_queued(tiny_llama, tokenizer):
    from fides_rag import PromptPair

    decoder = FidesDecoder(tiny_llama, tokenizer, method="standard")
    long = "Lyon is the capital of France. " * 400
    with pytest.raises(ValueError, match="context window"):
        decoder.generate(PromptPair(long, long), max_new_tokens=4)
    assert decoder.stats.queue_length == 0 and decoder.stats.requests == 0
