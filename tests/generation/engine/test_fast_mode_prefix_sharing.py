"""Fast mode's prefix-cache hits take the pool's kept prompt blocks by reference: the same tokens and values as the
same decoder without the prefix cache, fewer blocks held at once, and the kept blocks given back when the pool runs
short."""

from __future__ import annotations

import pytest

from fides_rag import FidesDecoder, PromptTemplate
from fides_rag.testing import MULTI_DOCUMENT_QUESTIONS, MULTI_DOCUMENTS, SAMPLE_DOCUMENTS, SAMPLE_QUESTIONS

QUESTIONS = [*MULTI_DOCUMENT_QUESTIONS, SAMPLE_QUESTIONS[1]]
DOCUMENTS = [*MULTI_DOCUMENTS, SAMPLE_DOCUMENTS[1]]
METHODS = ("standard", "cad", "fides")


def fast(model, tokenizer, **options) -> FidesDecoder:
    return FidesDecoder(
        model, tokenizer, prompt_template=PromptTemplate(stop=()), mode="fast", max_num_batched_tokens=32, **options
    )


def same(a, b):
    assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
    assert [s.values for s in a.steps] == [s.values for s in b.steps]


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_shared_prompt_blocks_give_the_tokens_and_values_of_the_decoder_without_the_cache(
    tiny_models, tokenizer, family
):
    on, off = fast(tiny_models[family], tokenizer), fast(tiny_models[family], tokenizer, prefix_caching=False)
    for method in METHODS:
        for q, docs in zip(QUESTIONS, DOCUMENTS):
            first = on.generate(q, docs, method=method, max_new_tokens=6)
            again = on.generate(q, docs, method=method, max_new_tokens=6)  # its prompt blocks are kept now
            plain = off.generate(q, docs, method=method, max_new_tokens=6)
            same(first, plain)
            same(again, plain)
    shared, unshared = on.stats, off.stats
    assert unshared.kv_pool_shared_tokens == 0 and unshared.kv_pool_kept_tokens == 0
    assert shared.kv_pool_used_tokens == 0 and shared.failed == 0  # every row gone; kept blocks are not rows'
    if family == "llama":  # gemma3's 16-token window leaves few blocks every layer wrote, and so few to keep
        assert shared.kv_pool_shared_tokens > 0 and shared.kv_pool_kept_tokens > 0


def close(a, b):
    """Fast mode under load: the same tokens; values to float32 rounding (rows may be batched differently)."""
    assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
    for x, y in zip(a.steps, b.steps):
        assert x.values == pytest.approx(y.values, abs=1e-5)


def test_requests_in_flight_together_take_their_common_prompt_blocks_by_reference(tiny_llama, tokenizer):
    on, off = fast(tiny_llama, tokenizer), fast(tiny_llama, tokenizer, prefix_caching=False)
    q, docs = QUESTIONS[0], DOCUMENTS[0]
    shared = [h.result() for h in [on.submit(q, docs, method="fides", max_new_tokens=12) for _ in range(4)]]
    copied = [h.result() for h in [off.submit(q, docs, method="fides", max_new_tokens=12) for _ in range(4)]]
    for a, b in zip(shared, copied):
        close(a, b)
    assert on.stats.kv_pool_shared_tokens > 0 and off.stats.kv_pool_shared_tokens == 0
    assert on.stats.kv_pool_used_tokens == 0 and on.stats.failed == 0


def test_kept_blocks_are_given_back_when_the_pool_runs_short(tiny_llama, tokenizer):
    decoder = fast(tiny_llama, tokenizer, kv_pool_tokens=1024)
    plain = fast(tiny_llama, tokenizer, kv_pool_tokens=1024, prefix_caching=False)
    for _ in range(2):
        for q, docs in zip(QUESTIONS, DOCUMENTS):
            same(
                decoder.generate(q, docs, method="fides", max_new_tokens=6),
                plain.generate(q, docs, method="fides", max_new_tokens=6),
            )
    stats = decoder.stats  # four prompts of ~400 tokens and their no-context rows do not all fit kept in the pool
    assert stats.failed == 0 and stats.kv_pool_kept_tokens <= 1024 and stats.kv_pool_shared_tokens > 0


def test_admission_counts_a_shared_prompt_block_once_so_requests_on_one_document_decode_together(tokenizer):
    """16 FIDES requests over one document of about 1,343 tokens, in a pool of 5,632 positions (352 blocks): each
    request's worst case is 114 blocks (this tokenizer's template is long), so counted apart no more than 3 fit; with
    the 99 blocks their prompts share counted once they all decode together, with the tokens of the decoder that
    shares nothing, and not one block short."""
    from fides_rag.testing import build_tiny_model

    model = build_tiny_model("llama", len(tokenizer), max_position_embeddings=4096)
    document = " ".join(f"Item {i} is stored in crate {i % 7}." for i in range(68))
    assert 1200 <= len(tokenizer(document).input_ids) <= 1500
    questions = [f"Where is item {i}?" for i in range(16)]
    options = dict(
        prompt_template=PromptTemplate(stop=()), mode="fast", kv_pool_tokens=5632, max_num_batched_tokens=512
    )
    shared = FidesDecoder(model, tokenizer, **options)
    alone = FidesDecoder(model, tokenizer, prefix_caching=False, **options)
    handles = [shared.submit(q, [document], method="fides", max_new_tokens=24, min_new_tokens=24) for q in questions]
    results = [h.result() for h in handles]
    assert shared.stats.failed == 0 and shared.stats.largest_batch == 16, shared.stats.largest_batch
    for question, result in zip(questions[:3], results):  # fast mode: among 16 rows, sums round apart; tokens hold
        alone_result = alone.generate(question, [document], method="fides", max_new_tokens=24, min_new_tokens=24)
        assert result.token_ids == alone_result.token_ids
    assert alone.stats.largest_batch <= 3
    assert shared.stats.kv_pool_used_tokens == 0  # every block held for a request at its admission was given back
    again = [shared.submit(q, [document], method="fides", max_new_tokens=24) for q in questions]
    for handle in again[::2]:
        handle.cancel()  # cancelled in the queue, prefilling or decoding: what was held for them goes back too
    assert all(h.result().finish_reason is not None for h in again[1::2])
    assert shared.stats.failed == 0 and shared.stats.kv_pool_used_tokens == 0
