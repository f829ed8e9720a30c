"""Concurrent callers of one decoder: requests from threads and asyncio share batched decodes, each result equal
to the request decoded alone; bad input fails alone; cancelled requests leave the batch."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fides_rag import FidesDecoder, PromptPair, PromptTemplate
from fides_rag.method.lens import ModelAnatomy

REQUESTS = [
    dict(
        question="What is the capital of France?",
        documents=["Lyon is the capital of France."],
        method="fides",
        max_new_tokens=6,
    ),
    dict(
        question="Who chose Canberra?",
        documents=["Canberra was chosen as a compromise."],
        method="cad",
        max_new_tokens=9,
    ),
    dict(
        question="What jumps?", documents=["The quick brown fox jumps."], method="fides", max_new_tokens=4, stop=["e"]
    ),
    dict(
        question="Which river?",
        documents=["Paris is on the Seine.", "Lyon is on the Rhone."],
        method="dvd",
        max_new_tokens=5,
    ),
    dict(question="Who wrote it?", documents=None, method="fides", max_new_tokens=5),
    dict(
        question="What is the capital?",
        documents=["Rome is the capital of France."],
        method="standard",
        max_new_tokens=7,
        stop=["a", "o"],
    ),
    dict(question="Where is it?", documents=["It is in Canberra."], method="cad", max_new_tokens=3),
    dict(
        context_prompt="Lyon is the capital of France. Question: capital? Answer:",
        no_context_prompt="Question: capital? Answer:",
        method="fides",
        max_new_tokens=6,
    ),
]


def alone(decoder: FidesDecoder, request: dict):
    request = dict(request)
    if "context_prompt" in request:
        return decoder.generate(PromptPair(request.pop("context_prompt"), request.pop("no_context_prompt")), **request)
    return decoder.generate(request.pop("question"), request.pop("documents"), **request)


def split(request: dict) -> tuple[object, object, dict]:
    request = dict(request)
    if "context_prompt" in request:
        return PromptPair(request.pop("context_prompt"), request.pop("no_context_prompt")), None, request
    return request.pop("question"), request.pop("documents"), request


@pytest.fixture
def decoder(tiny_llama, tokenizer):
    return FidesDecoder(tiny_llama, tokenizer, prompt_template=PromptTemplate(stop=()))


def test_concurrent_threads_get_what_they_would_get_alone(decoder):
    expected = [alone(decoder, r) for r in REQUESTS]
    decoder.configure(max_requests=8, window_s=0.2)
    before = decoder.stats.requests
    results = [None] * len(REQUESTS)
    barrier = threading.Barrier(len(REQUESTS))

    def call(i: int) -> None:
        question, documents, kwargs = split(REQUESTS[i])
        barrier.wait()
        results[i] = decoder.generate(question, documents, **kwargs)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for want, got in zip(expected, results):
        assert got.token_ids == want.token_ids and got.text == want.text
        assert got.method == want.method and got.requested_method == want.requested_method
        assert got.finish_reason == want.finish_reason
    assert decoder.stats.requests == before + len(REQUESTS)
    assert decoder.stats.largest_batch >= 2  # requests shared steps


def test_asyncio_requests_batch_and_bad_input_fails_alone(decoder):
    expected = [alone(decoder, r) for r in REQUESTS]
    decoder.configure(max_requests=8, window_s=0.2)

    async def main():
        calls = [decoder.agenerate(q, d, **kw) for q, d, kw in map(split, REQUESTS)]
        bad = [
            decoder.agenerate("   ", ["doc"]),  # empty question
            decoder.agenerate("Q?", ["only one"], method="dvd"),  # DVD needs two documents
            decoder.agenerate("Q?", ["doc"], temperature=float("inf"), do_sample=True),
        ]
        return await asyncio.gather(*calls, *bad, return_exceptions=True)

    outcomes = asyncio.run(main())
    for want, got in zip(expected, outcomes[: len(REQUESTS)]):
        assert not isinstance(got, BaseException), got
        assert got.token_ids == want.token_ids
    errors = outcomes[len(REQUESTS) :]
    assert all(isinstance(e, ValueError) for e in errors)
    assert "question must be a non-empty string" in str(errors[0]) and "at least 2 documents" in str(errors[1])
    assert "temperature" in str(errors[2])


def test_streams_from_a_shared_batch_concatenate_to_their_results(decoder):
    decoder.configure(max_requests=4, window_s=0.2)
    texts = {}

    def call(i: int) -> None:
        question, documents, kwargs = split(REQUESTS[i])
        texts[i] = "".join(decoder.stream(question, documents, **kwargs))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert texts[i] == alone(decoder, REQUESTS[i]).text


def test_a_cancelled_task_leaves_the_batch(decoder, tiny_llama):
    forwards: list[tuple[int, int]] = []  # (rows, tokens) of every forward
    handle = ModelAnatomy.of(decoder.model).backbone.register_forward_pre_hook(
        lambda module, args, kwargs: forwards.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    decoder.eos_token_ids = set()  # both run to their budget unless cancelled
    decoder.configure(max_requests=4, window_s=0.2)
    long = dict(question="What is the capital of France?", documents=["Lyon is the capital of France."], method="cad")

    async def main():
        keep = asyncio.create_task(decoder.agenerate(**long, max_new_tokens=200))
        doomed = asyncio.create_task(decoder.agenerate(**long, max_new_tokens=200, stop=["zzz"]))
        while (
            sum(shape == (4, 1) for shape in forwards) < 2
        ):  # a few decode steps of both (after their prompts' chunks)
            await asyncio.sleep(0.001)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return await keep

    try:
        kept = asyncio.run(main())
    finally:
        handle.remove()
    steps = [rows for rows, tokens in forwards if tokens == 1]  # the decode forwards (prompt chunks are longer)
    assert kept.token_ids == decoder.generate(**long, max_new_tokens=200).token_ids and len(kept.token_ids) == 200
    assert decoder.stats.cancelled == 1
    assert max(steps) == 4 and steps[-1] == 2  # decoded together, then the cancelled request's two rows left
    assert len(steps) == 199


def test_bad_engine_settings_are_refused_naming_the_setting(decoder):
    with pytest.raises(ValueError, match="max_requests"):
        decoder.configure(max_requests=0)
    with pytest.raises(ValueError, match="window_s"):
        decoder.configure(window_s=-1)


def test_batched_results_carry_their_recorded_values(decoder):
    decoder.configure(max_requests=4, window_s=0.2)
    short = decoder.submit("What jumps?", ["The quick brown fox jumps."], method="fides", max_new_tokens=2)
    long = decoder.submit(
        "Who chose Canberra?", ["Canberra was chosen as a compromise."], method="fides", max_new_tokens=9
    )
    for future in (short, long):
        result = future.result()
        assert result.steps and all(s.alpha is not None and s.opposition is not None for s in result.steps)
