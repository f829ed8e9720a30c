"""One generation request from body to response: validate, plan, admit to the engine, then answer (JSON) or
stream (server-sent events), cancelling when the client goes away and counting everything in the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from fides_rag.calls import Answer, Call, CallFactory
from fides_rag.decoder import FidesDecoder, QueueFullError, RequestHandle
from fides_rag.errors import BudgetBelowShortestAnswer, ContextWindowExceeded, GrammarLimitExceeded, KVPoolExceeded
from fides_rag.result import GenerationResult
from fides_rag.serve.agent_call import AgentCall, agent_call
from fides_rag.serve.errors import APIError, bad_request, validation_error
from fides_rag.serve.fides_headers import plan_headers, record_headers
from fides_rag.serve.limits import RequestLimits
from fides_rag.serve.logprobs import answer_steps, chat_logprobs, completion_logprobs
from fides_rag.serve.metrics import ServerMetrics
from fides_rag.serve.planning import Planner, build_call
from fides_rag.serve.protocol import ChatCompletionRequest, GenerationRequest, supported_fields
from fides_rag.serve.responses import ChunkWriter, new_id

logger = logging.getLogger("fides_rag.serve")
DISCONNECT_POLL_S = 0.2


def _budget_below_shortest(body: GenerationRequest, agent: AgentCall, err: BudgetBelowShortestAnswer) -> APIError:
    """The 400 of a structured answer (response_format, a forced call) whose budget cannot hold its shortest answer."""
    param = _budget_field(body)
    what = "tool call" if agent.calling is not None and agent.calling.forced else "response_format answer"
    return bad_request(
        f"{param}={err.budget} is fewer than the {err.needed} tokens the shortest complete {what} needs under its "
        f"grammar, so the answer could only be cut: set {param} to at least {err.needed}",
        param,
        "max_tokens_too_small",
    )


def _grammar_param(body: GenerationRequest, agent: AgentCall) -> str:
    """The field whose grammar this is: the response format's schema, or the forced tool's parameters."""
    if agent.calling is None or not agent.calling.forced or not isinstance(body, ChatCompletionRequest):
        return "response_format.json_schema.schema"
    forced = agent.calling.forced
    names = [tool.function.name for tool in body.tools or []]
    return (
        f"tools.{names.index(forced[0].name)}.function.parameters"
        if len(forced) == 1 and forced[0].name in names
        else "tools"
    )


def _budget_field(body: GenerationRequest) -> str:
    return "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"


def _not_fitting(body: GenerationRequest, err: ContextWindowExceeded) -> APIError:
    """The 400 of a prompt that, with the budget, passes the context window: `param` names the larger of the two."""
    prompt, budget = ("messages" if isinstance(body, ChatCompletionRequest) else "prompt"), _budget_field(body)
    return bad_request(
        f"the {prompt} ({err.tokens} tokens) and {budget}={err.max_new_tokens} do not fit the model's context window "
        f"of {err.context_window} tokens; shorten the {prompt} or lower {budget}",
        prompt if err.tokens >= err.max_new_tokens else budget,
        "context_length_exceeded",
    )


def _request_field(body: GenerationRequest, field: str | None) -> str | None:
    """The request's field that a core error's `field` names: the question and the prompt are the body's messages
    (chat) or prompt (completions)."""
    if field in ("question", "prompt"):
        return "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
    return field


def _queue_full(message: str) -> APIError:
    return APIError(429, message, type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})


class Admitted:
    """One request on the engine: its call, its agent fields, handle, endpoint kind and arrival time."""

    def __init__(self, call: Call, agent: AgentCall, handle: RequestHandle, chat: bool, started: float) -> None:
        self.call, self.agent, self.handle, self.chat, self.started = call, agent, handle, chat, started


class RequestHandling:
    """The request path of one server: the decoder, the default method, the metrics and the draining flag."""

    def __init__(self, decoder: FidesDecoder, model_name: str, method: str, limits: RequestLimits) -> None:
        self.decoder, self.model_name, self.method, self.limits = decoder, model_name, method, limits
        self.metrics = ServerMetrics(decoder)
        self.calls = CallFactory(decoder)
        self.draining = False
        self.admitting = 0
        """Requests between their admission check and the engine's queue (being parsed, planned, tokenised)."""

    async def counted(self, endpoint: str, call: Awaitable[Response]) -> Response:
        """The response of `call`, or its API error's (counted by status)."""
        try:
            return await call
        except APIError as err:
            self.metrics.requests.labels(endpoint, str(err.status)).inc()
            return err.response()

    async def serve(
        self,
        raw: Request,
        endpoint: str,
        model: type[GenerationRequest],
        plan_of: Planner,
        respond: Callable[..., dict[str, Any]],
    ) -> Response:
        raw_body = await self.limits.read_body(raw)
        self._take_place()  # before any planning, on the event loop: a refusal never waits behind others' work
        # Parsing, planning and tokenising take long for a long prompt: off the event loop, so health checks, metrics
        # and 429s answer meanwhile.
        try:
            body, admitted = await anyio.to_thread.run_sync(self._admit, raw_body, model, plan_of)
        finally:
            self.admitting -= 1  # queued on the engine by now (counted in its queue_length), or refused
        if body.stream:
            writer = ChunkWriter(admitted.chat, self.model_name)
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                self._events(endpoint, admitted, writer, include_usage),
                media_type="text/event-stream",
                headers=plan_headers(admitted.call.plan, admitted.call.options.requested),
            )
        try:
            result = await self._answer(raw, admitted)
            answer = admitted.call.finish(result)
            again = admitted.call.again(answer)
            if again is not None:  # an agent's turn that answered nothing: decoded once more under the answer rules
                result = await asyncio.wrap_future(again.submit().future)
                answer = again.finish(result)
        except asyncio.CancelledError:
            self.metrics.requests.labels(endpoint, "499").inc()
            return Response(status_code=499)
        except Exception as err:
            logger.exception("request failed")
            self.metrics.requests.labels(endpoint, "500").inc()
            return APIError(500, str(err), type="server_error").response()
        answer, logprobs = self._served(admitted, answer)
        self._observe(endpoint, admitted, result, admitted.handle.first_token_at)
        prefix = "chatcmpl" if admitted.chat else "cmpl"
        return JSONResponse(
            respond(new_id(prefix), self.model_name, answer, logprobs), headers=record_headers(answer.record)
        )

    def _served(self, admitted: Admitted, answer: Answer) -> tuple[Answer, dict[str, Any] | None]:
        """The answer with the agent fields' notes in its record, and its logprobs in the endpoint's shape (if
        asked)."""
        if admitted.agent.notes:
            answer.record["notes"] = list(dict.fromkeys([*answer.record["notes"], *admitted.agent.notes]))
        if admitted.agent.logprobs is None:
            return answer, None
        steps, decode = answer_steps(answer.result.steps), self.decoder.tokenizer.decode
        return answer, chat_logprobs(steps, decode) if admitted.chat else completion_logprobs(steps, decode)  # type: ignore[arg-type]  # one id list: a str

    def _validated(self, body: bytes, model: type[GenerationRequest]) -> GenerationRequest:
        try:
            return model.model_validate(self.limits.parse(body), strict=True)
        except ValidationError as err:
            raise validation_error(list(err.errors()), supported_fields(model)) from None  # type: ignore[arg-type]  # ErrorDetails are dicts

    def _take_place(self) -> None:
        """Admit one request to planning, or refuse it (503 while draining, 429 past max_queue): the requests being
        planned count as waiting, with those in the engine's queue, so a flood is refused at once, before any of its
        requests is parsed, planned or tokenised. Runs on the event loop only (the count needs no lock)."""
        if self.draining:
            raise APIError(
                503, "the server is shutting down; retry on another replica", type="server_error", code="shutting_down"
            )
        max_queue = self.decoder.limits.max_queue
        waiting = self.decoder.stats.queue_length + self.admitting
        if max_queue is not None and waiting >= max_queue:
            raise _queue_full(
                f"{waiting} requests are waiting (queued, or being planned), the engine's max_queue is {max_queue}; "
                "retry later"
            )
        self.admitting += 1

    def _admit(
        self, raw_body: bytes, model: type[GenerationRequest], plan_of: Planner
    ) -> tuple[GenerationRequest, Admitted]:
        """Validate, plan, build and submit one request (on a worker thread)."""
        started = time.perf_counter()
        body = self._validated(raw_body, model)
        self.limits.check_documents(
            self.decoder.tokenizer,
            body.documents or [],
            self.decoder.limits.context_window,
            body.budget() or self.decoder.max_new_tokens,
        )
        agent = agent_call(self.calls, body)
        try:
            call = build_call(self.calls, body, self.method, plan_of, agent)
            handle = call.submit(stream=body.stream)
        except QueueFullError as err:
            raise _queue_full(str(err)) from None
        except BudgetBelowShortestAnswer as err:
            raise _budget_below_shortest(body, agent, err) from None
        except ContextWindowExceeded as err:
            raise _not_fitting(body, err) from None
        except KVPoolExceeded as err:
            raise bad_request(" ".join(str(err).split()), _budget_field(body), "kv_pool_exceeded") from None
        except GrammarLimitExceeded as err:
            raise bad_request(" ".join(str(err).split()), _grammar_param(body, agent), "grammar_too_large") from None
        except (ValueError, TypeError) as err:
            raise bad_request(" ".join(str(err).split()), _request_field(body, getattr(err, "field", None))) from None
        try:
            self.limits.check_trimmed(call.plan.trimmed or handle.request.example.documents_trimmed)
        except APIError:
            handle.cancel()
            raise
        return body, Admitted(call, agent, handle, model is ChatCompletionRequest, started)

    @staticmethod
    async def _answer(raw: Request, admitted: Admitted) -> GenerationResult:
        """The result, cancelling the request if the client goes away first."""
        waiting = asyncio.wrap_future(admitted.handle.future)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S)
            if done:
                return waiting.result()
            if await raw.is_disconnected():
                admitted.handle.cancel()
                raise asyncio.CancelledError

    def _observe(
        self, endpoint: str, admitted: Admitted, result: GenerationResult, first_token_at: float | None
    ) -> None:
        end, metrics = time.perf_counter(), self.metrics
        metrics.requests.labels(endpoint, "200").inc()
        metrics.prompt_tokens.inc(result.prompt_tokens)
        metrics.completion_tokens.inc(len(result.token_ids))
        metrics.latency.labels(endpoint).observe(end - admitted.started)
        metrics.ttft.labels(endpoint).observe((first_token_at or end) - admitted.started)

    async def _events(
        self, endpoint: str, admitted: Admitted, writer: ChunkWriter, include_usage: bool
    ) -> AsyncIterator[str]:
        first = writer.start()
        if first:
            yield first
        try:
            async with contextlib.aclosing(admitted.call.astream(admitted.handle)) as items:
                async for item in items:
                    if isinstance(item, Answer):
                        answer = item
                    else:
                        yield writer.delta(item)
            answer, logprobs = self._served(admitted, answer)
        except (asyncio.CancelledError, GeneratorExit):  # the client went away: its rows leave at the next step
            self.metrics.requests.labels(endpoint, "499").inc()
            raise
        except Exception as err:  # the request failed after its stream began: say so in the stream
            logger.exception("request failed while streaming")
            self.metrics.requests.labels(endpoint, "500").inc()
            for event in writer.error(APIError(500, str(err), type="server_error").body()):
                yield event
            return
        finally:
            admitted.handle.cancel()  # no-op once finished
        self._observe(endpoint, admitted, answer.result, admitted.handle.first_token_at)
        for event in writer.end(answer, "", include_usage, logprobs):
            yield event
