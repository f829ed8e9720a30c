"""A request batcher: concurrent calls from threads and asyncio tasks are gathered within a short window,
up to a maximum batch size, and decoded in one batched decode; each result and stream goes back to its
caller. This is how serving engines earn their throughput: on a GPU, eight rows cost little more than one.

Requests are batched together when they share what the decoder holds per batch (the method, sampling
settings, min_new_tokens, user processors and criteria); token budgets, stop strings and seeds are held
per row. A greedy result equals the same request decoded alone. Bad input fails its own request at
submission; a cancelled request (a cancelled future or asyncio task) leaves the batch after the step.
Streams get their deltas step by step; results (with every recorded value) are handed over when the
batch's decode ends, because recorded values reach the host in one transfer at the end.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from typing_extensions import Unpack  # typing.Unpack from Python 3.11 on

from fides_rag.decoder import FidesDecoder
from fides_rag.generation.options import RequestOptions
from fides_rag.generation.prompting import PreparedExample
from fides_rag.generation.run import DecodeRun
from fides_rag.generation.settings import GenerationSettings, RowSettings
from fides_rag.generation.streaming import DeltaTracker, TextStream
from fides_rag.generation.validation import check_document_paths, refuse_document_paths
from fides_rag.result import GenerationResult
from fides_rag.rules import ContrastRule, get_method

_END = object()
_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared_batcher(decoder: FidesDecoder, *, max_batch_size: int = 8, window_s: float = 0.005) -> RequestBatcher:
    """The batcher that every caller of `decoder` with these settings shares (one per decoder and settings),
    so that LangChain and LlamaIndex objects wrapping one decoder batch their concurrent calls together."""
    with _SHARED_LOCK:
        batchers = _SHARED.setdefault(decoder, {})
        key = (max_batch_size, float(window_s))
        if key not in batchers:
            batchers[key] = RequestBatcher(decoder, max_batch_size=max_batch_size, window_s=window_s)
        return batchers[key]


@dataclass
class _Pending:
    example: PreparedExample
    requested: ContrastRule
    effective: ContrastRule
    settings: GenerationSettings
    future: Future
    deltas: Any = None
    """A callable taking each text delta (and `_END`), for streams; None otherwise."""
    tracker: DeltaTracker | None = None

    def key(self) -> tuple:
        """What must be equal for requests to share a decode (everything but budget, stops and seed)."""
        s = self.settings
        options = json.dumps(self.effective.options(), sort_keys=True, default=str)
        shared = (s.do_sample, s.temperature, s.top_p, s.top_k, s.min_new_tokens, id(s.logits_processor), id(s.stopping_criteria))
        return (type(self.effective), self.effective.name, options, shared)


@dataclass
class BatcherStats:
    """Counters of what the batcher did (for tests, logs and benchmarks)."""

    batches: int = 0
    requests: int = 0
    cancelled: int = 0
    largest_batch: int = 0
    in_flight: int = 0
    batch_sizes: list[int] = field(default_factory=list)


class RequestBatcher:
    """Gathers concurrent requests to one decoder into batched decodes.

    >>> batcher = RequestBatcher(decoder, max_batch_size=8, window_s=0.01)
    >>> batcher.generate("Who wrote it?", ["..."], method="fides")      # from any thread
    >>> await batcher.agenerate("Who wrote it?", ["..."])               # from asyncio
    """

    def __init__(self, decoder: FidesDecoder, *, max_batch_size: int = 8, window_s: float = 0.01) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {max_batch_size!r}")
        if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not 0 <= window_s <= 10:
            raise ValueError(f"window_s must be a number of seconds in [0, 10], got {window_s!r}")
        self.decoder = decoder
        self.max_batch_size = max_batch_size
        self.window_s = float(window_s)
        self.stats = BatcherStats()
        self._pending: list[_Pending] = []
        self._wake = threading.Condition()
        self._worker: threading.Thread | None = None

    # -- submission -----------------------------------------------------------------------------

    def _prepare(
        self,
        question: str | None,
        documents: Any,
        **options: Unpack[RequestOptions],
    ) -> _Pending:
        """Validate and tokenise one request in the caller's thread, so bad input fails it alone, at once."""
        decoder = self.decoder
        rest: dict[str, Any] = dict(options)
        context_prompt, no_context_prompt = rest.pop("context_prompt", None), rest.pop("no_context_prompt", None)
        add_special_tokens, untrusted = rest.pop("add_special_tokens", True), rest.pop("untrusted_texts", ())
        rule = decoder.resolve_method(rest.pop("method", None))
        settings = GenerationSettings.build(decoder.max_new_tokens, rest)
        if context_prompt is not None or no_context_prompt is not None:
            if question is not None:
                raise ValueError("give either a question (with documents) or context_prompt and no_context_prompt, not both")
            refuse_document_paths(rule)
            example = decoder.prompts.prepare_from_prompts(context_prompt, no_context_prompt, settings.max_new_tokens,
                                                           add_special_tokens, untrusted=untrusted)
        else:
            if untrusted:
                raise ValueError("untrusted_texts goes with context_prompt/no_context_prompt: a question and its documents are always tokenised as plain text")
            example = decoder.prepare(question, documents, settings.max_new_tokens, document_paths=rule.needs_document_paths)
        effective = rule if example.has_documents else get_method("standard")
        check_document_paths([example], [effective])
        decoder.setup_rules([effective])  # bad heads fail here, not inside a shared batch
        return _Pending(example, rule, effective, settings, Future())

    def submit(self, question: str | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> Future:
        """Queue one request; its `Future` resolves to the GenerationResult. Raises at once on bad input.

        kwargs: method, max_new_tokens, stop, do_sample, temperature, top_p, top_k, seed, ... as for
        `FidesDecoder.generate`, or context_prompt/no_context_prompt (and add_special_tokens) for raw prompts."""
        return self._enqueue(self._prepare(question, documents, **kwargs))

    def _enqueue(self, pending: _Pending) -> Future:
        with self._wake:
            self._pending.append(pending)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="fides-batcher", daemon=True)
                self._worker.start()
            self._wake.notify()
        return pending.future

    def generate(self, question: str | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> GenerationResult:
        """Submit and wait (thread-safe: concurrent callers share batches)."""
        return self.submit(question, documents, **kwargs).result()

    async def agenerate(self, question: str | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> GenerationResult:
        """Submit and await without blocking the event loop; cancelling the task drops its row from the batch."""
        return await asyncio.wrap_future(self.submit(question, documents, **kwargs))

    def stream(self, question: str | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> TextStream:
        """Text deltas of one request decoded in a shared batch; they concatenate to the final text, and
        `result` holds the GenerationResult once the stream is exhausted. Closing it drops the request."""
        pending = self._prepare(question, documents, **kwargs)
        deltas: queue.Queue = queue.Queue()
        pending.deltas, pending.tracker = deltas.put, DeltaTracker(pending.example.stop + pending.settings.stop)
        future = self._enqueue(pending)

        def iterate() -> Iterator[str]:
            try:
                while (delta := deltas.get()) is not _END:
                    yield delta
                stream.result = future.result()  # re-raises a failed decode
            finally:
                future.cancel()  # a stream closed early leaves the batch

        stream = TextStream(iterate())
        return stream

    async def astream(self, question: str | None = None, documents: Any = None, **kwargs: Unpack[RequestOptions]) -> AsyncIterator[str]:
        """`stream` for asyncio: deltas arrive without blocking the event loop; cancelling drops the row."""
        loop = asyncio.get_running_loop()
        pending = self._prepare(question, documents, **kwargs)
        deltas: asyncio.Queue = asyncio.Queue()
        pending.deltas = lambda delta: loop.call_soon_threadsafe(deltas.put_nowait, delta)
        pending.tracker = DeltaTracker(pending.example.stop + pending.settings.stop)
        future = self._enqueue(pending)
        try:
            while (delta := await deltas.get()) is not _END:
                yield delta
            await asyncio.wrap_future(future)
        finally:
            future.cancel()

    # -- the worker -----------------------------------------------------------------------------

    def _next_batch(self) -> list[_Pending]:
        """Wait for requests, gather more for `window_s` (or until a full batch), take one compatible group."""
        with self._wake:
            while not self._pending:
                self._wake.wait()
            deadline = time.monotonic() + self.window_s
            while len(self._pending) < self.max_batch_size and (left := deadline - time.monotonic()) > 0:
                self._wake.wait(left)
            live = [p for p in self._pending if not p.future.cancelled()]
            self.stats.cancelled += len(self._pending) - len(live)
            if not live:
                self._pending = []
                return []
            key = live[0].key()
            batch = [p for p in live if p.key() == key][: self.max_batch_size]
            self._pending = [p for p in live if p not in batch]
            return batch

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch:
                self._decode(batch)

    def _decode(self, batch: list[_Pending]) -> None:
        first = batch[0]
        budget = max(p.settings.max_new_tokens for p in batch)
        settings = GenerationSettings(
            **{**{name: getattr(first.settings, name) for name in GenerationSettings.__dataclass_fields__}, "max_new_tokens": budget, "stop": (), "seed": None}
        )
        rows = [RowSettings.of(p.settings) for p in batch]
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        self.stats.batch_sizes.append(len(batch))
        self.stats.in_flight = len(batch)
        delivered = [False] * len(batch)
        try:
            run = DecodeRun(self.decoder, [p.example for p in batch], first.effective, [p.requested for p in batch], settings, rows)
            for _ in run:
                for i, pending in enumerate(batch):
                    if delivered[i]:
                        continue
                    if pending.future.cancelled():
                        run.cancel(i)
                        self.stats.cancelled += 1
                        delivered[i] = True
                        self._close_stream(pending)
                    elif pending.deltas is not None and (delta := pending.tracker.update(run.text(i))):
                        pending.deltas(delta)
            # Results leave once the run has ended: the values rules recorded reach the host then, in one transfer.
            for i, pending in enumerate(batch):
                if not delivered[i]:
                    self._deliver(pending, run.result(i))
                    delivered[i] = True
        except BaseException as error:  # one batch's failure fails its own requests only
            for i, pending in enumerate(batch):
                if not delivered[i]:
                    self._close_stream(pending)
                    if pending.future.set_running_or_notify_cancel():
                        pending.future.set_exception(error)
        finally:
            self.stats.in_flight = 0

    def _deliver(self, pending: _Pending, result: GenerationResult) -> None:
        if pending.deltas is not None:
            final = pending.tracker.finish(result.text)
            if final:
                pending.deltas(final)
            pending.deltas(_END)
        if pending.future.set_running_or_notify_cancel():  # False: cancelled meanwhile
            pending.future.set_result(result)

    @staticmethod
    def _close_stream(pending: _Pending) -> None:
        if pending.deltas is not None:
            pending.deltas(_END)
