"""Streaming: text deltas of one generation as it is decoded, in a plain and an asyncio iterator."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fides_rag.generation.stopping import first_stop_index, held_back_suffix
from fides_rag.result import GenerationResult

logger = logging.getLogger(__name__)
Item = TypeVar("Item")


class TextStream(Iterator[str]):
    """Text deltas of one generation; after exhaustion `result` holds the full GenerationResult."""

    def __init__(self, deltas: Iterator[str]) -> None:
        self._deltas = deltas
        self.result: GenerationResult | None = None

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    def close(self) -> None:
        close = getattr(self._deltas, "close", None)
        if close is not None:
            close()


class DeltaTracker:
    """Turns the growing decoded text into safe deltas: nothing past a stop string, no partial stop string,
    no trailing whitespace or half-decoded character, so the deltas concatenate to the final text."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.emitted = ""

    def update(self, text: str) -> str:
        cut = first_stop_index(text, self.stops)
        text = text[:cut] if cut is not None else text[: len(text) - held_back_suffix(text, self.stops)]
        safe = text.lstrip().rstrip("\ufffd").rstrip()
        if len(safe) > len(self.emitted) and safe.startswith(self.emitted):
            delta, self.emitted = safe[len(self.emitted) :], safe
            return delta
        return ""

    def finish(self, final: str) -> str:
        if final.startswith(self.emitted):
            return final[len(self.emitted) :]
        logger.warning("streamed text %r is not a prefix of the final text %r", self.emitted, final)  # tokenizer quirk
        return ""


_DONE = object()


class AsyncTextStream(AsyncIterator[str]):
    """`TextStream` for asyncio: each delta is decoded on one worker thread of its own, so the event loop
    never blocks and the decoder's lock is taken and released on the same thread."""

    def __init__(self, stream: TextStream) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fides-stream")
        self._stream = stream

    @property
    def result(self) -> GenerationResult | None:
        """The full GenerationResult, once the stream is exhausted."""
        return self._stream.result

    def __aiter__(self) -> AsyncTextStream:
        return self

    def _next(self) -> object:
        return next(self._stream, _DONE)

    async def __anext__(self) -> str:
        delta = await asyncio.get_running_loop().run_in_executor(self._executor, self._next)
        if delta is _DONE:
            self._executor.shutdown(wait=False)
            raise StopAsyncIteration
        return delta  # type: ignore[return-value]

    async def aclose(self) -> None:
        """Stop decoding (the rows are dropped and the decoder's lock released) and free the worker thread."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._stream.close)
        self._executor.shutdown(wait=False)


async def iterate_in_thread(factory: Callable[[], Iterator[Item]]) -> AsyncIterator[Item]:
    """Items of a blocking iterator for asyncio: `factory()` runs and is iterated on a worker thread (in a copy of
    the caller's contextvars, so tracing context follows), each item handed over through a queue. An error in
    the worker is raised in the consumer; a consumer that stops early makes the worker stop and close the iterator.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    stopped = threading.Event()

    def put(kind: str, item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, item))
        except RuntimeError:  # the loop is closed: the consumer went away
            stopped.set()

    def work() -> None:
        try:
            iterator = factory()
            try:
                for item in iterator:
                    if stopped.is_set():
                        break
                    put("item", item)
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
        except BaseException as error:  # noqa: BLE001 - raised again in the consumer
            put("error", error)
        else:
            put("done", None)

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(work,), daemon=True, name="fides-iterate").start()
    try:
        while True:
            kind, item = await queue.get()
            if kind == "error":
                raise item
            if kind == "done":
                return
            yield item
    finally:
        stopped.set()
