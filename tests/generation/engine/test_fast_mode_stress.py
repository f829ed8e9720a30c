"""Fast mode under load: seeded requests of random prompt lengths (1 to 5,000 tokens), methods and budgets join and
leave a fast-mode decoder from several threads (eager and captured, in a small pool and the default one); none
fails, the engine decodes a fresh request afterwards, and most answers equal exact mode's (the tiny model's close
argmaxes can flip in fast mode's whole-pool sums). Also the long-prompt sequence: one prompt of ~4,474 tokens, then
more batches, in both modes."""

from __future__ import annotations

import random
import threading
import time

import pytest

from fides_rag import FidesDecoder, PromptTemplate
from fides_rag.eval.step_probe import prepared_from_ids
from fides_rag.testing import build_tiny_model

SEED = 1234
REQUESTS = 48
METHODS = ("standard", "cad", "fides", "adacad", "fides+agree", "cad+nwcad", "fides-stop")
AGREEMENT = 0.9
"""Share of answers that must equal exact mode's."""


@pytest.fixture(scope="module")
def long_llama(tokenizer):
    return build_tiny_model("llama", len(tokenizer), max_position_embeddings=8192)


def _ids(rng: random.Random, tokenizer, tokens: int) -> list[int]:
    return [rng.randrange(4, len(tokenizer)) for _ in range(tokens)]  # past the special tokens


def _prompt(rng: random.Random, tokenizer, context_tokens: int):
    """A prompt pair of exactly `context_tokens` context tokens (the question's last) and its question alone."""
    question = _ids(rng, tokenizer, min(context_tokens, rng.randint(1, 8)))
    return prepared_from_ids(tokenizer, _ids(rng, tokenizer, context_tokens - len(question)) + question, question)


def _jobs(tokenizer, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    lengths = [
        1,
        5000,
        *(
            rng.choice([rng.randint(1, 64), rng.randint(64, 1024), rng.randint(1024, 5000)])
            for _ in range(REQUESTS - 3)
        ),
    ]
    rng.shuffle(lengths)
    lengths.insert(0, rng.randint(4000, 5000))  # the first request fills an empty pool with a long prompt
    jobs = []
    for length in lengths:
        jobs.append(
            dict(
                prompt=_prompt(rng, tokenizer, length),
                method=rng.choice(METHODS),
                max_new_tokens=rng.randint(1, 6),
                delay=rng.random() * 0.05,
            )
        )
    return jobs


def _decode_from_threads(decoder: FidesDecoder, jobs: list[dict], threads: int = 4) -> list:
    """Each thread submits its share of `jobs` with small delays (so requests join and leave running batches)."""
    results: list = [None] * len(jobs)
    deadline = time.monotonic() + 150  # a stuck engine fails the test instead of hanging it

    def work(indices: list[int]) -> None:
        handles = []
        for i in indices:
            time.sleep(jobs[i]["delay"])
            job = jobs[i]
            handles.append(
                (i, decoder.submit(job["prompt"], method=job["method"], max_new_tokens=job["max_new_tokens"]))
            )
        for i, handle in handles:
            try:
                results[i] = handle.result(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as error:  # counted below
                results[i] = error

    first = decoder.submit(jobs[0]["prompt"], method=jobs[0]["method"], max_new_tokens=jobs[0]["max_new_tokens"])
    while decoder.stats.rows_in_flight == 0 and not first.done() and time.monotonic() < deadline:
        time.sleep(0.005)  # the first request's rows open the pool before any other joins
    workers = [threading.Thread(target=work, args=(list(range(1 + t, len(jobs), threads)),)) for t in range(threads)]
    for worker in workers:
        worker.start()
    try:
        results[0] = first.result(timeout=max(0.1, deadline - time.monotonic()))
    except Exception as error:  # counted below
        results[0] = error
    for worker in workers:
        worker.join()
    return results


@pytest.fixture(scope="module")
def exact_answers(long_llama, tokenizer):
    exact = FidesDecoder(long_llama, tokenizer, prompt_template=PromptTemplate(stop=()), mode="exact")
    return [
        exact.generate(j["prompt"], method=j["method"], max_new_tokens=j["max_new_tokens"]).token_ids
        for j in _jobs(tokenizer)
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "options",
    [{}, {"kv_pool_tokens": 8192}, {"compile": "eager", "buckets": [1, 2, 4, 8, 16, 32]}],
    ids=["default-pool", "small-pool", "captured"],
)
def test_random_requests_joining_and_leaving_a_fast_decoder_never_fail_and_mostly_equal_exact_mode(
    long_llama, tokenizer, exact_answers, options
):
    decoder = FidesDecoder(long_llama, tokenizer, prompt_template=PromptTemplate(stop=()), mode="fast", **options)
    jobs = _jobs(tokenizer)
    results = _decode_from_threads(decoder, jobs)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of {len(jobs)} requests failed, first: {errors[0]!r}"
    assert decoder.stats.failed == 0
    equal = sum(r.token_ids == e for r, e in zip(results, exact_answers))
    print(f"fast mode {options}: {equal}/{len(jobs)} answers equal exact mode's")
    assert equal / len(jobs) >= AGREEMENT
    fresh = decoder.generate("Which city?", ["Lyon is the capital of France."], method="fides", max_new_tokens=3)
    assert fresh.finish_reason is not None and decoder.stats.failed == 0  # the engine is healthy afterwards


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_a_long_prompt_then_more_batches_decode_without_failure(long_llama, tokenizer, mode):
    decoder = FidesDecoder(long_llama, tokenizer, prompt_template=PromptTemplate(stop=()), mode=mode)
    rng = random.Random(7)
    long = _prompt(rng, tokenizer, 4474)
    first = decoder.generate(long, method="fides", max_new_tokens=4)
    assert first.finish_reason is not None
    for size in (3, 8):
        prompts = [_prompt(rng, tokenizer, rng.randint(16, 600)) for _ in range(size)]
        results = decoder.generate_batch(prompts, method="cad", max_new_tokens=4)
        assert all(r.finish_reason is not None for r in results)
    assert decoder.stats.failed == 0
