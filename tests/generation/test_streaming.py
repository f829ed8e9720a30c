"""Streaming: the async stream gives the same deltas and result as the plain one, off the event loop."""

from __future__ import annotations

import asyncio

from fides_rag import FidesDecoder

QUESTION, DOCUMENTS = "What is the capital?", ["Lyon is the capital of France."]


def test_async_stream_equals_stream_and_generate(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    plain = decoder.stream(QUESTION, DOCUMENTS, method="fides", max_new_tokens=8)
    plain_deltas = list(plain)

    async def collect():
        stream = decoder.astream(QUESTION, DOCUMENTS, method="fides", max_new_tokens=8)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        deltas = [delta async for delta in stream]
        task.cancel()
        return deltas, stream.result, ticks

    deltas, result, ticks = asyncio.run(collect())
    assert deltas == plain_deltas and "".join(deltas) == result.text == plain.result.text
    assert result.token_ids == decoder.generate(QUESTION, DOCUMENTS, method="fides", max_new_tokens=8).token_ids
    assert ticks > 0  # the event loop kept running while tokens were decoded


def test_closing_an_async_stream_early_releases_the_decoder(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)

    async def first_then_close():
        stream = decoder.astream(QUESTION, DOCUMENTS, max_new_tokens=30)
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(first_then_close())
    assert decoder.generate(QUESTION, DOCUMENTS, max_new_tokens=2).token_ids  # the lock was released


def test_agenerate_equals_generate(tiny_llama, tokenizer):
    decoder = FidesDecoder(tiny_llama, tokenizer)
    result = asyncio.run(decoder.agenerate(QUESTION, DOCUMENTS, method="cad", max_new_tokens=6))
    assert result.token_ids == decoder.generate(QUESTION, DOCUMENTS, method="cad", max_new_tokens=6).token_ids
