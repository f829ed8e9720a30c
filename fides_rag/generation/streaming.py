"""Streaming: text deltas of one generation as the engine decodes it, for threads and for asyncio, through one
thread-to-consumer bridge (`Channel`). The engine's thread puts; any thread may read a `TextStream`, one `next()`
at a time (a server's thread pool hops threads between deltas), and an `AsyncTextStream` never blocks the loop.
Closing a stream, or cancelling the task that reads it, cancels its request: its rows leave the batch."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any, Generic, TypeVar

from fides_rag.generation.stopping import first_stop_index, held_back_suffix
from fides_rag.prompts.answer_text import AnswerText
from fides_rag.result import GenerationResult

logger = logging.getLogger(__name__)
Item = TypeVar("Item")
END = object()
"""What a channel yields after its last item."""


class Channel(Generic[Item]):
    """Items handed from one thread to a consumer in another thread (`get`) or in asyncio (`aget`), in order;
    `close()` ends it, `close(error)` makes the consumer raise `error` after the items already put."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._ready = threading.Condition()
        self._error: BaseException | None = None
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None

    def put(self, item: Item) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, future = waiter

            def wake() -> None:
                if not future.done():
                    future.set_result(None)

            with contextlib.suppress(RuntimeError):  # the consumer's loop is closed: nobody is reading any more
                loop.call_soon_threadsafe(wake)

    def close(self, error: BaseException | None = None) -> None:
        with self._ready:
            self._error = error
        self.put(END)  # type: ignore[arg-type]

    def _take(self) -> Any:
        item = self._items.popleft()
        if item is END:
            self._items.appendleft(END)  # stays ended
            if self._error is not None:
                raise self._error
        return item

    def get(self, timeout: float | None = None) -> Any:
        """The next item (END once closed), blocking this thread; TimeoutError after `timeout` seconds."""
        with self._ready:
            if not self._ready.wait_for(lambda: self._items, timeout):
                raise TimeoutError(f"no item within {timeout} s")
            return self._take()

    async def aget(self) -> Any:
        """The next item (END once closed), without blocking the event loop."""
        while True:
            with self._ready:
                if self._items:
                    return self._take()
                loop = asyncio.get_running_loop()
                future = loop.create_future()
                self._waiter = (loop, future)
            await future


class DeltaTracker:
    """Turns the growing decoded text into safe deltas: nothing past a stop string, no partial stop string,
    no trailing whitespace or half-decoded character, and nothing `answer_text` would cut (a leftover, markup or a role
    line, held back until decided), so the deltas concatenate to the final text."""

    def __init__(self, stops: tuple[str, ...], answer_text: AnswerText | None = None) -> None:
        self.stops = stops
        self.answer_text = answer_text
        self.emitted = ""

    def update(self, text: str) -> str:
        cut = first_stop_index(text, self.stops)
        text = text[:cut] if cut is not None else text[: len(text) - held_back_suffix(text, self.stops)]
        if self.answer_text is not None:
            text = self.answer_text.visible(text)
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


class _Stream:
    def __init__(self, channel: Channel[str], handle: Any) -> None:
        self._channel = channel
        self._handle = handle
        self.result: GenerationResult | None = None
        """The full GenerationResult, once the stream is exhausted."""

    def _finish(self) -> None:
        self.result = self._handle.result()  # raises the request's error, if it failed

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and self.result is None:
            handle.cancel()


class TextStream(_Stream, Iterator[str]):
    """Text deltas of one generation; after exhaustion `result` holds the full GenerationResult. Any thread may
    call `next()`; `close()` cancels the request."""

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        item = self._channel.get()
        if item is END:
            self._finish()
            raise StopIteration
        return item

    def close(self) -> None:
        self._handle.cancel()


class AsyncTextStream(_Stream, AsyncIterator[str]):
    """`TextStream` for asyncio: awaiting a delta never blocks the event loop; cancelling the reading task or
    `aclose()` cancels the request."""

    def __aiter__(self) -> AsyncTextStream:
        return self

    async def __anext__(self) -> str:
        try:
            item = await self._channel.aget()
        except asyncio.CancelledError:
            self._handle.cancel()
            raise
        if item is END:
            self._finish()
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self._handle.cancel()


async def iterate_in_thread(factory: Callable[[], Iterator[Item]]) -> AsyncGenerator[Item, None]:
    """Items of a blocking iterator for asyncio: `factory()` runs and is iterated on a worker thread (in a copy of
    the caller's contextvars, so tracing context follows), each item handed over through a `Channel`. An error in
    the worker is raised in the consumer; a consumer that stops early makes the worker stop and close the iterator.
    """
    channel: Channel[Item] = Channel()
    stopped = threading.Event()

    def work() -> None:
        try:
            iterator = factory()
            try:
                for item in iterator:
                    if stopped.is_set():
                        break
                    channel.put(item)
            finally:
                close = getattr(iterator, "close", None)
                if close is not None:
                    close()
        except BaseException as error:  # raised again in the consumer
            channel.close(error)
        else:
            channel.close()

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(work,), daemon=True, name="fides-iterate").start()
    try:
        while (item := await channel.aget()) is not END:
            yield item
    finally:
        stopped.set()
