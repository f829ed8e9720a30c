"""Fast mode's fixed KV pool through the decoder: a long prompt decodes as in exact mode with the default pool, a
request that can never fit the pool is refused at submission with nothing else touched, requests wait for blocks
instead of overrunning the pool, a failed step poisons no later request, and bad pool sizes are refused."""

from __future__ import annotations

import time

import pytest
import torch

from fides_rag import FidesDecoder, KVPoolExceeded, PromptTemplate
from fides_rag.testing import build_tiny_model

LONG_DOC = "The quick brown fox jumps over the lazy dog. " * 160  # ~4,500 tokens of the test tokenizer
SHORT = [
    ("What jumps?", ["The fox jumps."]),
    ("Who chose Canberra?", ["Canberra was chosen as a compromise."]),
    ("Where is the Seine?", ["The Seine flows through Paris."]),
]


@pytest.fixture(scope="module")
def long_llama(tokenizer):
    return build_tiny_model("llama", len(tokenizer), num_hidden_layers=8, max_position_embeddings=8192)


def decoder(model, tokenizer, mode: str, **options) -> FidesDecoder:
    return FidesDecoder(model, tokenizer, prompt_template=PromptTemplate(stop=()), mode=mode, **options)


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_a_prompt_of_thousands_of_tokens_decodes_and_later_batches_too(long_llama, tokenizer, mode):
    reference = decoder(long_llama, tokenizer, "exact")
    under_test = decoder(long_llama, tokenizer, mode)
    assert len(tokenizer(LONG_DOC).input_ids) > 4000
    long = under_test.generate("What jumps?", [LONG_DOC], method="fides", max_new_tokens=6)
    assert long.token_ids == reference.generate("What jumps?", [LONG_DOC], method="fides", max_new_tokens=6).token_ids
    handles = [under_test.submit(q, d, method="fides", max_new_tokens=5) for q, d in SHORT]
    for (q, d), handle in zip(SHORT, handles):
        assert handle.result().token_ids == reference.generate(q, d, method="fides", max_new_tokens=5).token_ids
    assert under_test.stats.failed == 0


def test_a_request_that_can_never_fit_the_pool_is_refused_at_submission_and_nothing_else_is_touched(
    long_llama, tokenizer
):
    fast = decoder(long_llama, tokenizer, "fast", kv_pool_tokens=1024)
    exact = decoder(long_llama, tokenizer, "exact")
    running = fast.submit(*SHORT[0], method="fides", max_new_tokens=8)
    with pytest.raises(KVPoolExceeded, match=r"1024 positions.*kv_pool_tokens or kv_cache_memory") as refused:
        fast.submit("What jumps?", [LONG_DOC], method="fides", max_new_tokens=6)
    assert isinstance(refused.value, ValueError)
    assert running.result().token_ids == exact.generate(*SHORT[0], method="fides", max_new_tokens=8).token_ids
    assert fast.stats.kv_pool_tokens == 1024 and fast.stats.failed == 0 and fast.stats.kv_pool_used_tokens == 0


def test_requests_wait_for_blocks_instead_of_overrunning_the_pool(tiny_llama, tokenizer):
    exact = decoder(tiny_llama, tokenizer, "exact")
    fast = decoder(
        tiny_llama, tokenizer, "fast", kv_pool_tokens=640
    )  # 40 blocks: one of these FIDES requests (28 blocks) at a time
    seen: list[int] = []
    handles = [fast.submit(q, d, method="fides", max_new_tokens=12) for q, d in SHORT]
    while not all(h.done() for h in handles):
        seen.append(fast.stats.kv_pool_used_tokens)
        time.sleep(0.002)
    for (q, d), handle in zip(SHORT, handles):
        assert handle.result().token_ids == exact.generate(q, d, method="fides", max_new_tokens=12).token_ids
    assert max(seen) <= 640 and fast.stats.largest_batch < len(SHORT)
    assert fast.stats.kv_pool_used_tokens == 0


def test_a_failed_step_fails_its_requests_once_and_the_next_ones_decode(tiny_llama, tokenizer):
    exact = decoder(tiny_llama, tokenizer, "exact")
    fast = decoder(tiny_llama, tokenizer, "fast")
    calls = {"n": 0}

    def fail_once(module, inputs, output):
        calls["n"] += 1
        if calls["n"] == 3:  # inside the step that prefills and joins the request
            raise RuntimeError("a failing forward")

    hook = tiny_llama.model.layers[0].register_forward_hook(fail_once)
    try:
        with pytest.raises(RuntimeError, match="a failing forward"):
            fast.generate(*SHORT[0], method="fides", max_new_tokens=6)
    finally:
        hook.remove()
    assert fast.stats.failed == 1
    for q, d in SHORT:
        assert (
            fast.generate(q, d, method="fides", max_new_tokens=6).token_ids
            == exact.generate(q, d, method="fides", max_new_tokens=6).token_ids
        )
    assert fast.stats.kv_pool_used_tokens == 0


@pytest.mark.parametrize(
    "options, field",
    [
        ({"kv_pool_tokens": 0}, "kv_pool_tokens"),
        ({"kv_pool_tokens": 8}, "kv_pool_tokens"),
        ({"kv_pool_tokens": "1024"}, "kv_pool_tokens"),
        ({"kv_pool_tokens": True}, "kv_pool_tokens"),
        ({"kv_cache_memory": 100}, "kv_cache_memory"),
        ({"kv_cache_memory": 0.5}, "kv_cache_memory"),
        ({"kv_cache_memory": -1}, "kv_cache_memory"),
        ({"kv_pool_tokens": 1024, "kv_cache_memory": 2**20}, "kv_cache_memory"),
    ],
)
def test_bad_pool_sizes_are_refused_naming_the_field(tiny_llama, tokenizer, options, field):
    with pytest.raises(ValueError, match=field):
        decoder(tiny_llama, tokenizer, "fast", **options)


def test_the_default_cpu_pool_is_sized_from_the_model_not_gigabytes(tiny_llama, tokenizer):
    fast = decoder(tiny_llama, tokenizer, "fast", kv_cache_memory=2**20)
    assert 0 < fast.stats.kv_pool_tokens <= 2**20 // (2 * 4 * 2 * 8 * 4)  # bytes per position of the tiny llama
    default = decoder(tiny_llama, tokenizer, "fast")
    assert default.stats.kv_pool_tokens * 2 * 4 * 2 * 8 * 4 <= 64 * 2**20
    assert decoder(tiny_llama, tokenizer, "exact").stats.kv_pool_tokens == 0
    assert torch.get_default_dtype() == torch.float32
