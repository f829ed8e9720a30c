"""A request in the engine: its public handle (a future, an optional delta channel, cancellation, timings)
and the engine's ticket that turns its units' states into results, stream deltas and failures."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from fides_rag.generation.engine.layout import Unit
from fides_rag.generation.requests import Request
from fides_rag.generation.results import assemble
from fides_rag.generation.streaming import AsyncTextStream, Channel, DeltaTracker, TextStream
from fides_rag.result import GenerationResult


class RequestHandle:
    """A submitted request: `result()` waits for it (a GenerationResult, or label -> result for several methods),
    `cancel()` drops it from the batch at the next step, and a streaming request's deltas arrive on `stream()`.

    Timings (`time.perf_counter()` seconds): submitted_at, first_token_at (its first decoded token), finished_at."""

    def __init__(self, request: Request, engine: Any) -> None:
        self.request = request
        self.future: Future = Future()
        self.channel: Channel[str] | None = Channel() if request.streams else None
        self._engine = engine
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the result (decoding on this thread while no other does); cancels the request if the wait is
        interrupted (Ctrl-C)."""
        try:
            return self._engine.wait(self, timeout)
        except KeyboardInterrupt:
            self.cancel()
            raise

    def cancel(self) -> bool:
        """Drop the request: it leaves the queue, or its rows leave the batch after the current step."""
        return self.future.cancel()

    @property
    def cancelled(self) -> bool:
        return self.future.cancelled()

    def done(self) -> bool:
        return self.future.done()

    def stream(self) -> TextStream:
        assert self.channel is not None, "submit the request with stream=True"
        return TextStream(self.channel, self)

    def astream(self) -> AsyncTextStream:
        assert self.channel is not None, "submit the request with stream=True"
        return AsyncTextStream(self.channel, self)


class Ticket:
    """The engine's side of one request: its units (one per distinct method), results, deltas and failure."""

    def __init__(self, handle: RequestHandle, units: list[Unit]) -> None:
        self.handle = handle
        self.units = units
        self._answer_text = handle.request.answer_text
        self._tracker = DeltaTracker(handle.request.text_stops, self._answer_text) if handle.channel else None

    @property
    def request(self) -> Request:
        return self.handle.request

    @property
    def finished(self) -> bool:
        return all(u.finish_reason is not None for u in self.units)

    def stream_delta(self) -> None:
        """Hand the stream whatever new text its answer holds (a streaming request has one method)."""
        if self.handle.first_token_at is None and self.units[0].generated:
            self.handle.first_token_at = time.perf_counter()
        channel = self.handle.channel
        if self._tracker is not None and channel is not None:  # the tracker exists exactly when the channel does
            delta = self._tracker.update(self.units[0].text.text)
            if delta:
                channel.put(delta)

    def results(self, decode: Any) -> Any:
        """One GenerationResult per method (label -> result), or the one result of a one-method request."""
        request = self.request
        by_label: dict[str, GenerationResult] = {}
        for method, unit_index in zip(request.methods, request.unit_of):
            unit = self.units[unit_index]
            by_label[method.label] = assemble(
                request.example, unit, method.effective, method.requested, request.text_stops, decode, self._answer_text
            )
        return next(iter(by_label.values())) if len(by_label) == 1 and not request.several else by_label

    def deliver(self, decode: Any) -> None:
        """Set the result (unless cancelled meanwhile), then end the stream with the rest of the text."""
        self.handle.finished_at = time.perf_counter()
        result = self.results(decode)
        if self.handle.future.set_running_or_notify_cancel():
            self.handle.future.set_result(result)
        channel = self.handle.channel
        if self._tracker is not None and channel is not None:  # the tracker exists exactly when the channel does
            final = self._tracker.finish(result.text)
            if final:
                channel.put(final)
            channel.close()

    def fail(self, error: BaseException) -> None:
        """Fail the request with `error` (once: a request already done keeps its outcome)."""
        if self.handle.future.done():
            return
        self.handle.finished_at = time.perf_counter()
        if self.handle.future.set_running_or_notify_cancel():
            self.handle.future.set_exception(error)
        if self.handle.channel is not None:
            self.handle.channel.close(error)

    def close_cancelled(self) -> None:
        """A cancelled request's stream ends (its future is already cancelled)."""
        self.handle.finished_at = time.perf_counter()
        if self.handle.channel is not None:
            self.handle.channel.close()
