"""Retrieval-head discovery: sample layout, the hit rule by hand, a planted head, determinism and the cache."""

from __future__ import annotations

import json
import time

import pytest
import torch

from fides_rag.method import heads as heads_module
from fides_rag.method.heads import (
    DiscoverySettings,
    HeadRanking,
    build_copy_samples,
    cache_file,
    copy_probe,
    copy_token_pool,
    discover_retrieval_heads,
    eager_attention,
    retrieval_head_ranking,
    retrieval_heads,
    retrieval_hits,
)
from fides_rag.testing import build_tiny_model

SMALL = dict(num_samples=4, context_length=40, needle_length=8, cue_length=3, min_copy_rate=0.0, batch_size=2)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FIDES_RAG_CACHE", str(tmp_path))
    return tmp_path


def test_samples_layout_and_determinism():
    pool, prefix = list(range(100, 160)), [2]
    settings = DiscoverySettings(num_samples=5, context_length=30, needle_length=6, cue_length=3, seed=7)
    samples = build_copy_samples(pool, prefix, settings)
    assert samples == build_copy_samples(pool, prefix, settings)
    assert samples != build_copy_samples(pool, prefix, DiscoverySettings(**{**settings.to_dict(), "seed": 8}))
    starts = []
    for s in samples:
        ids, n, p = list(s.input_ids), s.needle_length, s.needle_start
        assert len(ids) == 1 + 30 + 3 + 6 and ids[0] == 2
        needle = ids[p : p + n]
        assert ids[-n:] == needle and len(set(needle)) == n  # the copy repeats the needle, whose tokens are distinct
        assert ids[-n - 3 : -n] == ids[p - 3 : p]  # the cue is the 3 tokens before the needle
        haystack = ids[1:p] + ids[p + n : -n - 3]
        assert len(haystack) == 24 and not set(haystack) & set(needle) and set(ids[1:]) <= set(pool)
        starts.append(p)
    assert starts == sorted(starts) and starts[0] >= 1 + 3  # depths spread from shallow to deep
    with pytest.raises(ValueError, match="only 10 word-start tokens"):
        build_copy_samples(list(range(10)), prefix, settings)
    narrow = build_copy_samples(pool, prefix, DiscoverySettings(**{**settings.to_dict(), "vocabulary": 20}))
    assert all(100 <= t < 120 for s in narrow for t in s.input_ids[1:])  # only the first 20 words
    with pytest.raises(ValueError, match="only 11 word-start tokens"):
        build_copy_samples(pool, prefix, DiscoverySettings(**{**settings.to_dict(), "vocabulary": 11}))


def test_settings_validated():
    for bad in (
        dict(num_samples=0),
        dict(needle_length=True),
        dict(min_copy_rate=1.5),
        dict(seed=0.5),
        dict(context_length=10),
    ):
        with pytest.raises(ValueError, match="retrieval-head discovery"):
            DiscoverySettings(**bad)


def test_word_pool_excludes_special_tokens(tokenizer):
    pool = copy_token_pool(tokenizer, 10_000)
    assert len(pool) >= 32 and not set(pool) & set(tokenizer.all_special_ids)
    for token in tokenizer.convert_ids_to_tokens(pool):
        assert token[0] == "Ġ" and len(token) >= 3 and token[1:].isascii() and token[1:].isalpha()
    assert copy_token_pool(tokenizer, 50) == [t for t in pool if t < 50]


def test_retrieval_hits_by_hand():
    # one sample, T = 10, needle at positions 3..5 holding tokens 30, 31, 32; emitted tokens at the 3 copy steps
    ids = torch.tensor([[1, 10, 11, 30, 31, 32, 11, 30, 31, 32]])
    emitted = torch.tensor([[30, 31, 99]])
    top = torch.tensor(
        [[[[3, 4, 5], [2, 3, 4], [7, 8, 5]]]]  # [B=1, L=1, H=3, N=3]
    )
    # head 0: steps 0, 1 hit (right token in the needle); step 2 points at 32 but 99 was emitted
    # head 1: off by one, never the emitted token; head 2: tokens right at 7, 8 but outside the needle
    hits = retrieval_hits(top, emitted, ids, torch.tensor([3]), 3)
    assert hits.tolist() == [[[2, 0, 0]]]


def test_discovery_ranks_every_head_deterministically(tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    before = model.config._attn_implementation
    ranking = discover_retrieval_heads(model, tokenizer, DiscoverySettings(**SMALL))
    assert model.config._attn_implementation == before  # the eager switch is undone
    assert sorted(ranking.heads) == [(layer, head) for layer in range(1, 5) for head in range(4)]
    assert all(0.0 <= s <= 1.0 for s in ranking.scores)
    keys = [(-s, lh) for s, lh in zip(ranking.scores, ranking.heads)]
    assert keys == sorted(keys)  # by score, ties by (layer, head)
    assert ranking.samples_total == ranking.samples_counted == 4  # min_copy_rate 0 keeps every sample
    again = discover_retrieval_heads(model, tokenizer, DiscoverySettings(**{**SMALL, "batch_size": 3}))
    assert (again.heads, again.scores) == (ranking.heads, ranking.scores)


@pytest.mark.parametrize("family", ["gemma3_text", "qwen3"])
def test_discovery_other_families(tokenizer, family):
    model = build_tiny_model(family, len(tokenizer))
    ranking = discover_retrieval_heads(model, tokenizer, DiscoverySettings(**SMALL))
    assert len(ranking.heads) == 16 and len(set(ranking.heads)) == 16


def test_probe_reads_the_copy_positions(tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    ids = torch.tensor(
        [list(s.input_ids) for s in build_copy_samples(list(range(100, 160)), [2], DiscoverySettings(**SMALL))[:2]]
    )
    n, width = 8, ids.shape[1]
    with torch.inference_mode(), eager_attention(model):
        emitted, top = copy_probe(model, ids, n)
        full = model(input_ids=ids, output_attentions=True)
    assert torch.equal(emitted, full.logits[:, width - n - 1 : width - 1].argmax(-1))
    want = torch.stack([a[:, :, width - n - 1 : width - 1].argmax(-1) for a in full.attentions], dim=1)
    assert top.shape == (2, 4, 4, n) and torch.equal(top, want)


def test_a_model_that_cannot_copy_is_refused(tokenizer):
    model = build_tiny_model("llama", len(tokenizer))
    with pytest.raises(ValueError, match="copied at least 50% of the needle in none of 4 samples"):
        discover_retrieval_heads(model, tokenizer, DiscoverySettings(**{**SMALL, "min_copy_rate": 0.5}))


def test_planted_copy_head_ranks_first(tokenizer, monkeypatch):
    """Make the model copy perfectly and head 2 of layer 3 attend to the needle token it copies."""
    real_probe = heads_module.copy_probe

    def planted(model, input_ids, num_targets):
        emitted, top = real_probe(model, input_ids, num_targets)
        emitted = input_ids[:, -num_targets:].clone()  # perfect copies
        # the needle is the first earlier occurrence of the copied tokens
        for b in range(input_ids.shape[0]):
            row = input_ids[b].tolist()
            start = next(i for i in range(len(row)) if row[i : i + num_targets] == row[-num_targets:])
            top[b, 2, 2] = torch.arange(start, start + num_targets)
            top[b, 0, 1] = torch.arange(start, start + num_targets) - 1  # off by one: never the emitted token
        return emitted, top

    monkeypatch.setattr(heads_module, "copy_probe", planted)
    model = build_tiny_model("llama", len(tokenizer))
    ranking = discover_retrieval_heads(model, tokenizer, DiscoverySettings(**{**SMALL, "min_copy_rate": 0.5}))
    assert ranking.heads[0] == (3, 2) and ranking.scores[0] == 1.0
    assert ranking.copy_rate == 1.0 and ranking.samples_counted == 4
    assert dict(zip(ranking.heads, ranking.scores))[(1, 1)] == 0.0
    assert all(s < 1.0 for s in ranking.scores[1:])


def test_cache_round_trip(tokenizer, cache_dir, monkeypatch, caplog):
    model = build_tiny_model("llama", len(tokenizer))
    settings = DiscoverySettings(**SMALL)
    path = cache_file(model, tokenizer, settings)
    assert path.parent == cache_dir / "retrieval_heads" and not path.exists()
    first = retrieval_head_ranking(model, tokenizer, settings)
    stored = json.loads(path.read_text())
    assert stored["settings"] == settings.to_dict() and len(stored["ranking"]) == 16
    assert HeadRanking.from_json(stored) == first

    def no_discovery(*args, **kwargs):
        raise AssertionError("the cached ranking should have been used")

    monkeypatch.setattr(heads_module, "discover_retrieval_heads", no_discovery)
    assert retrieval_head_ranking(model, tokenizer, settings) == first
    assert retrieval_head_ranking(model, tokenizer, DiscoverySettings(**{**SMALL, "batch_size": 1})) == first
    top = retrieval_heads(model, tokenizer, 5, settings)
    assert top == first.top(5) and sum(len(h) for h in top.values()) == 5 and list(top) == sorted(top)
    assert set(first.heads[:5]) == {(layer, h) for layer, hs in top.items() for h in hs}

    # another seed, other settings or other weights: another file
    assert cache_file(model, tokenizer, DiscoverySettings(**{**SMALL, "seed": 1})) != path
    assert cache_file(build_tiny_model("llama", len(tokenizer), seed=1), tokenizer, settings) != path

    # a damaged file is rediscovered and rewritten
    monkeypatch.undo()
    monkeypatch.setenv("FIDES_RAG_CACHE", str(cache_dir))
    path.write_text("{not json")
    with caplog.at_level("WARNING", logger="fides_rag.method.heads"):
        assert retrieval_head_ranking(model, tokenizer, settings) == first
    assert "ignoring retrieval-head cache" in caplog.text
    assert HeadRanking.from_json(json.loads(path.read_text())) == first


def test_top_k_validated(tokenizer, cache_dir):
    model = build_tiny_model("llama", len(tokenizer))
    for bad in (0, 17, 2.0, True):
        with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, 16\]"):
            retrieval_heads(model, tokenizer, bad, DiscoverySettings(**SMALL))
    assert not (cache_dir / "retrieval_heads").exists()  # refused before any discovery


@pytest.mark.slow
def test_smollm2_discovery_finds_copying_heads():
    from fides_rag.models.loading import load_model

    model, tokenizer = load_model("smollm2-135m-instruct", device="cpu")
    started = time.perf_counter()
    ranking = discover_retrieval_heads(model, tokenizer)
    seconds = time.perf_counter() - started
    print(
        f"smollm2-135m: {seconds:.1f}s, copy rate {ranking.copy_rate:.2f}, top heads",
        list(zip(ranking.heads[:10], [round(s, 3) for s in ranking.scores[:10]])),
    )
    assert ranking.copy_rate > 0.5 and ranking.samples_counted >= ranking.samples_total // 2
    assert ranking.scores[0] > 0.5  # some head points at what the model copies most of the time
