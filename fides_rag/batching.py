"""Deprecated: `FidesDecoder.submit` (a future) is the one front door to the engine; `RequestBatcher` remains as a
thin shim over it. Concurrent calls from threads and asyncio tasks, each decoded on the decoder's one
continuous-batching engine. A request joins the running decode at the next step boundary and its result
(with every recorded value) comes back the moment it finishes; a greedy result equals the same request decoded
alone. Bad input fails its own request at submission; a cancelled future or task, or a closed stream, leaves
the batch after the step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Any

from typing_extensions import Unpack  # typing.Unpack from Python 3.11 on

from fides_rag.decoder import FidesDecoder
from fides_rag.generation.engine import DecodeEngine, EngineStats
from fides_rag.generation.options import RequestOptions
from fides_rag.generation.requests import PromptPair
from fides_rag.generation.tickets import RequestHandle
from fides_rag.generation.streaming import TextStream
from fides_rag.result import GenerationResult


def shared_batcher(decoder: FidesDecoder, *, max_batch_size: int | None = None, window_s: float | None = None) -> RequestBatcher:
    """A batcher on `decoder`'s engine (every batcher of one decoder shares it, so LangChain and LlamaIndex objects
    wrapping one decoder decode their concurrent calls together)."""
    return RequestBatcher(decoder, max_batch_size=max_batch_size, window_s=window_s)


class RequestBatcher:
    """Concurrent requests to one decoder, decoded together on its engine.

    >>> batcher = RequestBatcher(decoder)
    >>> batcher.generate("Who wrote it?", ["..."], method="fides")      # from any thread
    >>> await batcher.agenerate("Who wrote it?", ["..."])               # from asyncio

    `max_batch_size` (requests decoding at once) and `window_s` (how long an idle engine waits for concurrent
    arrivals) configure the decoder's one engine, so they apply to every batcher of that decoder; None leaves
    them as they are.
    """

    def __init__(self, decoder: FidesDecoder, *, max_batch_size: int | None = None, window_s: float | None = None) -> None:
        if max_batch_size is not None and (isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1):
            raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
        if window_s is not None and (isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not 0 <= window_s <= 10):
            raise ValueError(f"window_s must be a number of seconds in [0, 10], got {window_s!r}")
        self.decoder = decoder
        settings: dict[str, Any] = {"max_requests": max_batch_size, "window_s": window_s}
        settings = {name: value for name, value in settings.items() if value is not None}
        if settings:
            decoder.configure(**settings)

    @property
    def engine(self) -> DecodeEngine:
        return self.decoder.engine

    @property
    def stats(self) -> EngineStats:
        return self.engine.stats

    def _submit(self, question: str | PromptPair | None, documents: Any, stream: bool, options: dict[str, Any], wait_here: bool = False) -> RequestHandle:
        """Validate and queue one request in the caller's thread, so bad input fails it alone, at once."""
        rest = dict(options)
        context_prompt, no_context_prompt = rest.pop("context_prompt", None), rest.pop("no_context_prompt", None)
        add_special_tokens, untrusted = rest.pop("add_special_tokens", True), rest.pop("untrusted_texts", ())
        if context_prompt is not None or no_context_prompt is not None:
            if question is not None:
                raise ValueError("give either a question (with documents) or context_prompt and no_context_prompt, not both")
            untrusted = (untrusted,) if isinstance(untrusted, str) else tuple(untrusted)
            question = PromptPair(context_prompt, no_context_prompt, add_special_tokens, untrusted)
        elif untrusted:
            raise ValueError("untrusted_texts goes with context_prompt/no_context_prompt: a question and its documents are always tokenised as plain text")
        return self.decoder.submit(question, documents, stream=stream, wait_here=wait_here, **rest)

    def submit(self, question: str | PromptPair | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> Future:
        """Queue one request; its `Future` resolves to the GenerationResult (cancel it to drop the request).
        Raises at once on bad input.

        kwargs: method, max_new_tokens, stop, do_sample, temperature, top_p, top_k, seed, ... as for
        `FidesDecoder.generate`, or context_prompt/no_context_prompt (and add_special_tokens) for raw prompts."""
        return self._submit(question, documents, False, kwargs).future

    def generate(self, question: str | PromptPair | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> GenerationResult:
        """Submit and wait (thread-safe: concurrent callers share the engine's steps)."""
        return self._submit(question, documents, False, kwargs, wait_here=True).result()

    async def agenerate(self, question: str | PromptPair | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> GenerationResult:
        """Submit and await without blocking the event loop; cancelling the task drops the request."""
        return await asyncio.wrap_future(self.submit(question, documents, **kwargs))

    def stream(self, question: str | PromptPair | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> TextStream:
        """Text deltas of one request; they concatenate to the final text, and `result` holds the GenerationResult
        once the stream is exhausted. Closing it drops the request."""
        return self._submit(question, documents, True, kwargs).stream()

    async def astream(self, question: str | PromptPair | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> AsyncIterator[str]:
        """`stream` for asyncio: deltas arrive without blocking the event loop; cancelling drops the request."""
        stream = self._submit(question, documents, True, kwargs).astream()
        try:
            async for delta in stream:
                yield delta
        finally:
            await stream.aclose()
