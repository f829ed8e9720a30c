"""Streaming: the async stream gives the same deltas and result as the plain one, off the event loop."""

from __future__ import annotations

import asyncio

import pytest

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


def test_iterate_in_thread_hands_over_items_errors_and_stops_the_worker_early():
    import asyncio
    import contextvars
    import threading

    from fides_rag.generation.streaming import iterate_in_thread

    where = contextvars.ContextVar("where", default="unset")
    closed = threading.Event()

    def numbers():
        try:
            for i in range(100):
                yield (i, where.get(), threading.current_thread() is threading.main_thread())
        finally:
            closed.set()

    def failing():
        yield 1
        raise KeyError("boom")

    async def main():
        where.set("caller")
        items = [item async for item in iterate_in_thread(lambda: iter([(1, where.get()), (2, where.get())]))]
        assert items == [(1, "caller"), (2, "caller")]  # run in a copy of the caller's context
        seen = []
        with pytest.raises(KeyError, match="boom"):
            async for item in iterate_in_thread(failing):
                seen.append(item)
        assert seen == [1]
        stream = iterate_in_thread(numbers)
        first = await stream.__anext__()
        assert first == (0, "caller", False)  # produced on a worker thread
        await stream.aclose()
        await asyncio.to_thread(closed.wait, 10)
        assert closed.is_set()  # the worker stopped and closed the iterator

    asyncio.run(main())
