"""One call from plan to answer: the decoder's keywords (the plan's method and stops, the options, a forced call's
grammar), decoding through the facade (`FidesDecoder.submit`), and the answer read back once for every front door:
tool calls parsed (held back while streaming), the structure parsed, an agent's turn that answered nothing decoded
again under the answer rules (`unanswered`), the finish reason and the FIDES record. The decoder's results and
streams are already cut of template leftovers, markup and role lines (`fides_rag.prompts.answer_text`)."""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fides_rag.calls.metadata import FINISH_REASONS, record, usage
from fides_rag.calls.options import CallOptions
from fides_rag.calls.planning import ChatPlan
from fides_rag.calls.structure import parse_structure, refuse_cutting_stops, refuse_other_grammar
from fides_rag.calls.tools import ToolCall, ToolCalling, ToolCallStream
from fides_rag.calls.unanswered import answer_rules, is_agent_turn, unanswered_cause
from fides_rag.decoder import RequestHandle
from fides_rag.result import GenerationResult

if TYPE_CHECKING:
    from fides_rag.decoder import FidesDecoder

logger = logging.getLogger("fides_rag.calls")


@dataclass
class Answer:
    """What a call answered, as every front door reports it."""

    text: str
    """The content: cleaned, with tool calls taken out."""
    tool_calls: list[ToolCall]
    parsed: Any
    """The structured answer (a `structure` call), else None."""
    parsing_error: Exception | None
    finish_reason: str
    """OpenAI's: "stop", "length" or "tool_calls"."""
    record: dict[str, Any]
    """The FIDES record (method, alphas, steps, prompts, notes, where the documents came from, fallback)."""
    result: GenerationResult
    unanswered: str | None = None
    """Why an agent's turn answered nothing after its second decoding (None: it answered); the integrations raise
    `UnansweredError` with it, the server's record carries it as a note."""

    @property
    def notes(self) -> list[str]:
        return self.record["notes"]

    @property
    def usage(self) -> dict[str, int]:
        return usage(self.result)


class AnswerLog:
    """A model object's recent answers, oldest first, shared safely between threads: `last` (the newest answer's
    GenerationResult) and `entries()` ({"result": GenerationResult, "info": the FIDES record} each)."""

    def __init__(self, size: int = 16) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, answer: Answer) -> Answer:
        with self._lock:
            self._entries.append({"result": answer.result, "info": answer.record})
        return answer

    @property
    def last(self) -> GenerationResult | None:
        with self._lock:
            return self._entries[-1]["result"] if self._entries else None

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._entries)


class Call:
    """One planned call on a decoder: `run()` (or `arun`, `stream`, `astream`) decodes it and returns an `Answer`.

    `structure`: what the answer parses as (a pydantic class, or True for any JSON), its grammar already in
    `options.constraint`; `extra`: what the front door adds to the record (model_name, prompt_type, ...)."""

    def __init__(
        self,
        decoder: FidesDecoder,
        plan: ChatPlan,
        options: CallOptions,
        *,
        calling: ToolCalling | None = None,
        native_tools: bool = False,
        structure: object = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.decoder, self.plan, self.options, self.calling = decoder, plan, options, calling
        self.native_tools, self.structure, self.extra = native_tools, structure, dict(extra or {})
        self.retried: str | None = None
        """Why this call decodes again under the answer rules (the first decoding's cause), else None."""
        forced = calling.constraint() if calling is not None else None
        if forced is not None:
            refuse_other_grammar(options.constraint, "a forced tool_choice is decoded under its own grammar")
            options.constraint = {"json_schema": forced}
        if options.constraint and options.stop:
            refuse_cutting_stops(
                options.stop,
                getattr(decoder, "tokenizer", None),
                "a forced tool call" if forced is not None else "a structured answer",
            )
        options.check_fallback(plan)

    # -- decoding ---------------------------------------------------------------------------------

    def decode_kwargs(self) -> dict[str, Any]:
        """The decoder's keywords: the plan's method where it forces one, the plan's stops, sampling, the grammar."""
        opts = self.options
        stop = self.plan.stop_strings(opts.stop, self.decoder.prompts.template, tools=self.calling is not None)
        kwargs = dict(
            method=self.plan.method or opts.method,
            max_new_tokens=opts.max_new_tokens,
            stop=stop,
            **opts.sampling,
            **opts.constraint,
        )
        return answer_rules(self.decoder, kwargs) if self.retried is not None else kwargs

    def submit(self, *, stream: bool = False, wait_here: bool = False) -> RequestHandle:
        """Queue the call on the decoder's engine (bad input raises here, before anything decodes)."""
        prompt, documents = self.plan.prompt()
        return self.decoder.submit(prompt, documents, stream=stream, wait_here=wait_here, **self.decode_kwargs())

    def run(self) -> Answer:
        answer = self.finish(self.submit(wait_here=True).result())
        again = self.again(answer)
        return again.run() if again is not None else answer

    async def arun(self) -> Answer:
        handle = self.submit()
        answer = self.finish(await asyncio.wrap_future(handle.future))
        again = self.again(answer)
        return await again.arun() if again is not None else answer

    def again(self, answer: Answer) -> Call | None:
        """The same call under the answer rules, when `answer` is an agent's turn that answered nothing the first
        time."""
        if answer.unanswered is None or self.retried is not None:
            return None
        again = copy.copy(self)
        again.options = copy.copy(self.options)
        again.retried = answer.unanswered
        return again

    def shown(self) -> CallStream:
        """What a streamed answer may show as it comes (possible calls held back; the decoder's deltas are already
        cut)."""
        return CallStream(self)

    def stream(self, handle: RequestHandle | None = None) -> Iterator[str | Answer]:
        """Text deltas as they may be shown, then the Answer as the last item (`handle`: the call already submitted
        with `submit(stream=True)`; an agent's turn that answered nothing streams its second decoding under the answer
        rules)."""
        for item in self._stream_once(handle):
            again = self.again(item) if isinstance(item, Answer) else None
            if again is not None:
                yield from again.stream()
                return
            yield item

    def _stream_once(self, handle: RequestHandle | None) -> Iterator[str | Answer]:
        shown = self.shown()
        stream = (handle or self.submit(stream=True)).stream()
        try:
            for delta in stream:
                yield from shown.visible(delta)
        finally:
            stream.close()
        yield from shown.ending(stream.result)  # type: ignore[arg-type]  # set once the stream ended

    def deltas(self) -> Iterator[tuple[str, Answer | None]]:
        """`stream` as (delta, None) pairs, one delta held back so that the last pair carries the Answer: a front door
        whose last response holds the record (its delta may be "")."""
        held: str | None = None
        for item in self.stream():
            if isinstance(item, Answer):
                yield held or "", item
                return
            if held is not None:
                yield held, None
            held = item

    async def astream(self, handle: RequestHandle | None = None) -> AsyncGenerator[str | Answer, None]:
        """`stream` for asyncio; cancelling the task that reads it cancels the request."""
        async for item in self._astream_once(handle):
            again = self.again(item) if isinstance(item, Answer) else None
            if again is not None:
                async for retried in again.astream():
                    yield retried
                return
            yield item

    async def _astream_once(self, handle: RequestHandle | None) -> AsyncIterator[str | Answer]:
        shown = self.shown()
        stream = (handle or self.submit(stream=True)).astream()
        try:
            async for delta in stream:
                for item in shown.visible(delta):
                    yield item
        finally:
            await stream.aclose()
        for item in shown.ending(stream.result):  # type: ignore[arg-type,assignment]  # set once the stream ended
            yield item

    # -- reading the answer -----------------------------------------------------------------------

    def finish(self, result: GenerationResult) -> Answer:
        """The Answer of a decoded result."""
        content, calls = self.calling.parse(result.text) if self.calling is not None else (result.text, [])
        notes = []
        missing = (
            self.calling.missing_call_note(calls, self.options.max_new_tokens) if self.calling is not None else None
        )
        if missing is not None:  # a forced call that gave none: its text is never an answer
            logger.warning(missing)
            notes.append(missing)
            content = ""
        parsed, error = None, None
        if self.structure is not None and not calls:
            try:
                parsed = parse_structure(
                    result.text, result.finish_reason, None if self.structure is True else self.structure
                )
            except ValueError as err:
                error = err
        if self.retried is not None:
            notes.append(
                f"the first decoding answered nothing ({self.retried}): decoded again with the end of turn and "
                "markup barred from the first token"
            )
        unanswered = unanswered_cause(self, content, calls, result)
        if unanswered is not None:
            logger.log(
                logging.WARNING if self.retried is not None else logging.INFO,
                "the model answered nothing: %s",
                unanswered,
            )
            notes.append(f"the model answered nothing: {unanswered}")
        meta = record(
            self.plan,
            result,
            self.options.requested,
            calling=self.calling,
            native_tools=self.native_tools,
            notes=notes,
            **self.extra,
        )
        finish = "tool_calls" if calls else FINISH_REASONS[result.finish_reason]
        return Answer(content, list(calls), parsed, error, finish, meta, result, unanswered)


class CallStream:
    """A streamed call's text as it may be shown: `feed(delta)` returns what can be shown now, `finish(result)` the
    Answer and the last text to show."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self._calls = ToolCallStream(call.calling) if call.calling is not None else None
        self._agent = is_agent_turn(call)
        self._text = self._emitted = ""

    def feed(self, delta: str) -> str:
        if self._calls is not None:
            delta = self._calls.feed(delta)
        self._text += delta
        if self._agent and self._text.lstrip().startswith(("{", "[")):
            return ""  # a call written as the answer: not shown, the turn may be decoded again
        new, self._emitted = self._text[len(self._emitted) :], self._text
        return new

    def visible(self, delta: str) -> list[str]:
        """What of `delta` can be shown now: [] or [text]."""
        text = self.feed(delta)
        return [text] if text else []

    def ending(self, result: GenerationResult) -> list[str | Answer]:
        """The last text to show (if any), then the Answer."""
        answer, last = self.finish(result)
        return [last, answer] if last else [answer]

    def finish(self, result: GenerationResult) -> tuple[Answer, str]:
        answer = self.call.finish(result)
        shown = self._emitted.strip() if answer.tool_calls else self._emitted
        return answer, answer.text[len(shown) :] if answer.text.startswith(shown) else answer.text
