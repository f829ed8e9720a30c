"""The FastAPI app: OpenAI's chat and completion endpoints on the decoder's continuous-batching engine, with
models, health and Prometheus metrics. One process serves every client; each request joins the running decode."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from fides_rag.chat import AnswerStream, ChatPlan
from fides_rag.decoder import FidesDecoder
from fides_rag.generation.engine import QueueFullError
from fides_rag.generation.tickets import RequestHandle
from fides_rag.serve.errors import APIError, bad_request, validation_error
from fides_rag.serve.metrics import ServerMetrics
from fides_rag.serve.planning import chat_plan, completion_plan, decode_options, method_of
from fides_rag.serve.protocol import ChatCompletionRequest, CompletionRequest, Sampling, supported_fields
from fides_rag.serve.responses import ChunkWriter, chat_completion, new_id, text_completion

logger = logging.getLogger("fides_rag.serve")
DISCONNECT_POLL_S = 0.2


class _Admitted:
    """One request on the engine: its plan, handle and the name of the method asked for."""

    def __init__(self, plan: ChatPlan, handle: RequestHandle, requested: str, started: float) -> None:
        self.plan, self.handle, self.requested, self.started = plan, handle, requested, started


def build_app(decoder: FidesDecoder, *, model_name: str, method: str = "fides", max_queue: int | None = None,
              shutdown_timeout_s: float = 30.0) -> FastAPI:
    """The OpenAI-compatible app on `decoder`'s engine: `method` is the default rule, `max_queue` bounds the
    requests waiting for the engine (beyond it: 429), and at shutdown the requests in flight get
    `shutdown_timeout_s` seconds to finish before they are cancelled."""
    method_of(Sampling(method=method), method)  # an unknown default method fails here, not at the first request
    engine = decoder.engine
    if max_queue is not None:
        engine.configure(max_queue=max_queue)
    metrics = ServerMetrics(engine)
    state = {"draining": False}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        state["draining"] = True
        deadline = time.monotonic() + shutdown_timeout_s
        while (engine.requests_in_flight or engine.queue_length) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    app = FastAPI(title="fides-rag", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        model = ChatCompletionRequest if request.url.path.endswith("chat/completions") else CompletionRequest
        return validation_error(list(err.errors()), supported_fields(model)).response()

    def admit(body: Sampling, plan_of: Callable[[FidesDecoder, Any, int], ChatPlan], stream: bool) -> _Admitted:
        if state["draining"]:
            raise APIError(503, "the server is shutting down; retry on another replica", type="server_error", code="shutting_down")
        started = time.perf_counter()
        max_new = body.budget() or decoder.max_new_tokens  # type: ignore[attr-defined]
        rule = method_of(body, method)
        plan = plan_of(decoder, body, max_new)
        options = decode_options(decoder, plan, body, rule, max_new)
        prompt, documents = plan.prompt()
        try:
            request = decoder.requests.build(prompt, documents, stream=stream, **options)
        except (ValueError, TypeError) as err:
            raise bad_request(" ".join(str(err).split())) from None
        try:
            handle = engine.submit([request])[0]
        except QueueFullError as err:
            raise APIError(429, str(err), type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"}) from None
        return _Admitted(plan, handle, body.method or method, started)

    async def answer(raw: Request, admitted: _Admitted) -> Any:
        """The result, cancelling the request if the client goes away first."""
        waiting = asyncio.wrap_future(admitted.handle.future)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S)
            if done:
                return waiting.result()
            if await raw.is_disconnected():
                admitted.handle.cancel()
                raise asyncio.CancelledError

    def observe(endpoint: str, admitted: _Admitted, result: Any, first_token_at: float | None) -> None:
        end = time.perf_counter()
        metrics.requests.labels(endpoint, "200").inc()
        metrics.prompt_tokens.inc(result.prompt_tokens)
        metrics.completion_tokens.inc(len(result.token_ids))
        metrics.latency.labels(endpoint).observe(end - admitted.started)
        metrics.ttft.labels(endpoint).observe((first_token_at or end) - admitted.started)

    async def events(endpoint: str, admitted: _Admitted, writer: ChunkWriter, include_usage: bool) -> AsyncIterator[str]:
        shown = AnswerStream(admitted.plan, decoder.prompt_template)
        stream = admitted.handle.astream()
        first = writer.start()
        if first:
            yield first
        first_token_at = None
        try:
            async for delta in stream:
                first_token_at = first_token_at or time.perf_counter()
                text = shown.feed(delta)
                if text:
                    yield writer.delta(text)
            result, last = shown.finish(stream.result)
        except (asyncio.CancelledError, GeneratorExit):  # the client went away: its rows leave at the next step
            metrics.requests.labels(endpoint, "499").inc()
            raise
        except Exception as err:  # the request failed after its stream began: say so in the stream
            logger.exception("request failed while streaming")
            metrics.requests.labels(endpoint, "500").inc()
            for event in writer.error(APIError(500, str(err), type="server_error").body()):
                yield event
            return
        finally:
            admitted.handle.cancel()  # a client that went away frees its rows (no-op once finished)
        if last:
            yield writer.delta(last)
        observe(endpoint, admitted, result, first_token_at)
        for event in writer.end(admitted.plan, result, admitted.requested, include_usage):
            yield event

    async def serve(raw: Request, endpoint: str, model: type[Sampling], plan_of: Callable[..., ChatPlan],
                    respond: Callable[..., dict[str, Any]]) -> Response:
        try:
            payload = json.loads(await raw.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise APIError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None
        if not isinstance(payload, dict):
            raise bad_request("the request body must be a JSON object")
        try:
            body = model.model_validate(payload)
        except ValidationError as err:
            raise validation_error(list(err.errors()), supported_fields(model)) from None
        admitted = admit(body, plan_of, body.stream)
        if body.stream:
            writer = ChunkWriter(model is ChatCompletionRequest, model_name)
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(events(endpoint, admitted, writer, include_usage), media_type="text/event-stream")
        try:
            result = await answer(raw, admitted)
        except asyncio.CancelledError:
            metrics.requests.labels(endpoint, "499").inc()
            return Response(status_code=499)
        except Exception as err:
            logger.exception("request failed")
            metrics.requests.labels(endpoint, "500").inc()
            return APIError(500, str(err), type="server_error").response()
        result = admitted.plan.finish(result, decoder.prompt_template)
        observe(endpoint, admitted, result, admitted.handle.first_token_at)
        prefix = "chatcmpl" if model is ChatCompletionRequest else "cmpl"
        return JSONResponse(respond(new_id(prefix), model_name, admitted.plan, result, admitted.requested))

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await _counted(raw, "chat", lambda: serve(raw, "chat", ChatCompletionRequest, chat_plan, chat_completion))

    @app.post("/v1/completions")
    async def completions(raw: Request) -> Response:
        return await _counted(raw, "completions", lambda: serve(raw, "completions", CompletionRequest, completion_plan, text_completion))

    async def _counted(raw: Request, endpoint: str, call: Callable[[], Any]) -> Response:
        try:
            return await call()
        except APIError as err:
            metrics.requests.labels(endpoint, str(err.status)).inc()
            return err.response()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "fides-rag"}]}

    @app.get("/health")
    async def health() -> JSONResponse:
        status = "draining" if state["draining"] else "ok"
        return JSONResponse({"status": status, "queue_length": engine.queue_length, "requests_in_flight": engine.requests_in_flight},
                            status_code=503 if state["draining"] else 200)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
