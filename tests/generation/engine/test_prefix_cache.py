"""The prefix cache by block: every full block of every prompt is cached and found by its chained hash, so a later
request that shares a block-aligned prefix with an earlier one (the same instructions and documents, another
question) reuses it, with the same tokens and values as with the cache off."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from fides_rag import FidesDecoder, PromptTemplate
from fides_rag.generation.engine.prefilling import chunk_cuts
from fides_rag.generation.engine.prefix_cache import PrefixCache
from fides_rag.testing import MULTI_DOCUMENTS

DOCUMENT = " ".join(d for docs in MULTI_DOCUMENTS for d in docs)
FIRST, SECOND = "Where is the tower?", "Who built the bridge in the old town?"


def same(a, b):
    assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
    assert [s.values for s in a.steps] == [s.values for s in b.steps]


def decoders(model, tokenizer, **options):
    template = PromptTemplate(stop=())
    return (
        FidesDecoder(model, tokenizer, prompt_template=template, max_num_batched_tokens=32, **options),
        FidesDecoder(
            model, tokenizer, prompt_template=template, max_num_batched_tokens=32, prefix_caching=False, **options
        ),
    )


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("method", ["standard", "fides"])
def test_a_later_request_reuses_the_blocks_it_shares_with_an_earlier_one(tiny_models, tokenizer, family, method):
    on, off = decoders(tiny_models[family], tokenizer)
    same(
        on.generate(FIRST, DOCUMENT, method=method, max_new_tokens=6),
        off.generate(FIRST, DOCUMENT, method=method, max_new_tokens=6),
    )
    before = on.stats
    same(
        on.generate(SECOND, DOCUMENT, method=method, max_new_tokens=6),
        off.generate(SECOND, DOCUMENT, method=method, max_new_tokens=6),
    )

    first, second = (on._requests.build(q, DOCUMENT, method=method).example.context_ids for q in (FIRST, SECOND))
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert shared > 64
    after = on.stats
    assert after.prefix_cache_hits > before.prefix_cache_hits
    assert (
        after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens >= shared - 32
    )  # up to the last 32-token chunk cut
    assert after.prefill_tokens < off.stats.prefill_tokens
    assert off.stats.prefix_cache_hits == 0 and off.stats.prefix_cache_entries == 0


def test_every_full_block_of_a_chunk_that_ends_on_a_block_is_stored(tiny_llama, tokenizer):
    on, _ = decoders(tiny_llama, tokenizer, method="standard", prefix_block_size=8)
    on.generate(FIRST, DOCUMENT, max_new_tokens=2)
    length = len(on._requests.build(FIRST, DOCUMENT).example.context_ids)
    assert on.limits.prefix_block_size == 8 and on.stats.prefix_cache_entries == (length - 1) // 32 * 32 // 8


def test_a_tight_bound_evicts_blocks_and_keeps_the_tokens(tiny_llama, tokenizer):
    """Room for 64 tokens: the two paths of a FIDES request evict each other's blocks; a standard request then keeps
    the first blocks of its prompt (a chain is evicted from its end) and the next one reuses them."""
    on, off = decoders(tiny_llama, tokenizer, prefix_cache_bytes=40_000)
    for question in (FIRST, SECOND):
        same(on.generate(question, DOCUMENT, max_new_tokens=4), off.generate(question, DOCUMENT, max_new_tokens=4))
    stats = on.stats
    assert 0 < stats.prefix_cache_bytes <= 40_000 and stats.prefix_cache_evictions > 0
    for question in (FIRST, SECOND):
        same(
            on.generate(question, DOCUMENT, method="standard", max_new_tokens=4),
            off.generate(question, DOCUMENT, method="standard", max_new_tokens=4),
        )
    stats = on.stats
    assert stats.prefix_cache_bytes <= 40_000 and stats.prefix_cache_hits > 0


def _layer(heads: int, length: int) -> DynamicLayer:
    layer = DynamicLayer()
    layer.keys, layer.values = (
        torch.randn(1, heads, length, 4, dtype=torch.float32),
        torch.randn(1, heads, length, 4, dtype=torch.float32),
    )
    return layer


@pytest.mark.parametrize("heads", [(2, 2), (2, 3)])
def test_a_stored_chunk_is_found_by_a_prompt_with_the_same_tokens_and_cuts_only(heads):
    cache, tokens = PrefixCache(block_size=4), list(range(12))
    layers = [_layer(h, 8) for h in heads]
    cache.store(tokens, [8, 12], (), (0, 8), layers)
    assert len(cache) == 2 and cache.bytes == sum(2 * h * 8 * 4 * 4 for h in heads)
    length, found = cache.lookup([*tokens[:8], 99, 98], [8, 10], ())
    assert length == 8
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) for a, b in zip(found, layers))
    assert cache.lookup(tokens, [4, 8, 12], ()) == (0, None)  # cut elsewhere: other forwards, other states
    assert cache.lookup(tokens, [8, 12], ((0, (1,)),)) == (0, None)  # other masked heads
    assert cache.lookup(tokens[:8], [8], ()) == (0, None)  # the whole prompt is never taken
    assert cache.stats.hits == 1 and cache.stats.hit_tokens == 8 and cache.stats.misses == 3


def test_storing_a_prompt_chunk_by_chunk_hashes_each_block_once(monkeypatch):
    """Storing a prompt's chunks with the caller's hashes hashes no more blocks than hashing the prompt once, and
    keeps the same blocks as storing each chunk with the prompt hashed afresh."""
    size, length = 4, 66
    tokens = list(range(length))
    cuts = chunk_cuts(length, 8, [], size)
    assert len(cuts) > 4 and cuts[-1] % size  # many chunks; the last one ends off a block and is not stored
    hashed = [0]
    blake2b = hashlib.blake2b

    def counting(*args: Any, **kwargs: Any) -> Any:
        hashed[0] += 1
        return blake2b(*args, **kwargs)

    monkeypatch.setattr(hashlib, "blake2b", counting)
    whole = PrefixCache(block_size=size).block_hashes(tokens, cuts, ())
    hashing_once = hashed[0]
    assert len(whole) == length // size and hashing_once >= len(whole)

    def stored(hashes: list[bytes] | None) -> PrefixCache:
        cache, start = PrefixCache(block_size=size), 0
        for end in cuts:
            cache.store(tokens, cuts, (), (start, end), [_layer(2, end)], hashes)
            start = end
        return cache

    known: list[bytes] = []
    hashed[0] = 0
    incremental = stored(known)
    assert hashed[0] == hashing_once and known == whole
    hashed[0] = 0
    afresh = stored(None)
    assert hashed[0] > 2 * hashing_once  # without the caller's hashes each chunk rehashes the prompt up to its end
    assert len(incremental) == len(afresh) == length // size and incremental.bytes == afresh.bytes
    resumed = [*tokens[:56], 99, 98]
    assert incremental.lookup(resumed, [*cuts[:7], 58], ())[0] == afresh.lookup(resumed, [*cuts[:7], 58], ())[0] == 56


def test_chunk_cuts_fall_on_blocks():
    assert chunk_cuts(100, 40, anchors=[21, 50, 7], block=16) == [16, 32, 48, 64, 96, 100]
    assert chunk_cuts(100, 8, anchors=[], block=16) == [16, 32, 48, 64, 80, 96, 100]


@pytest.mark.parametrize("size", [0, -16, 1.5, True, "16"])
def test_a_bad_block_size_is_refused(tiny_llama, tokenizer, size):
    with pytest.raises(ValueError, match="prefix_block_size must be an integer >= 1"):
        FidesDecoder(tiny_llama, tokenizer, prefix_block_size=size)
