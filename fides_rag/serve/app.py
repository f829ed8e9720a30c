"""The FastAPI app: OpenAI's chat and completion endpoints on the decoder's continuous-batching engine, with
models, health and Prometheus metrics. One process serves every client; each request joins the running decode."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from fides_rag.calls import resolve_method
from fides_rag.decoder import FidesDecoder
from fides_rag.serve.access import AccessControl, AccessPolicy
from fides_rag.serve.errors import APIError
from fides_rag.serve.handling import RequestHandling
from fides_rag.serve.limits import RequestLimits
from fides_rag.serve.planning import chat_plan, completion_plan
from fides_rag.serve.protocol import ChatCompletionRequest, CompletionRequest
from fides_rag.serve.responses import chat_completion, text_completion

_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])


def build_app(
    decoder: FidesDecoder,
    *,
    model_name: str,
    method: str = "fides",
    max_queue: int | None = None,
    shutdown_timeout_s: float = 30.0,
    limits: RequestLimits | None = None,
    access: AccessPolicy | None = None,
) -> FastAPI:
    """The OpenAI-compatible app on `decoder`'s engine: `method` is the default rule, `max_queue` bounds the
    requests waiting for the engine (beyond it: 429), and at shutdown the requests in flight get
    `shutdown_timeout_s` seconds to finish before they are cancelled. `limits`: what one request may hold (default
    `RequestLimits()`); `access`: API key, allowed hosts and CORS origins (default: none checked, as for an app
    mounted behind its own gateway; `fides-rag serve` sets them from its flags)."""
    resolve_method(method)  # an unknown default method fails here, not at the first request
    if max_queue is not None:
        decoder.configure(max_queue=max_queue)
    access = access or AccessPolicy(allowed_hosts=None)
    handling = RequestHandling(decoder, model_name, method, limits or RequestLimits())
    metrics = handling.metrics

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        handling.draining = True
        deadline = time.monotonic() + shutdown_timeout_s
        while ((stats := decoder.stats).requests_in_flight or stats.queue_length) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    # No redirects: a path with a trailing slash is served as the path without it (`_route`), any other unknown path
    # gets a 404 in OpenAI's shape; Starlette's default, a bare 307, is an answer many clients do not follow with the
    # body.
    app = FastAPI(title="fides-rag", lifespan=lifespan, redirect_slashes=False)

    def _route(method: str, path: str) -> Callable[[_Endpoint], _Endpoint]:
        def register(endpoint: _Endpoint) -> _Endpoint:
            app.add_api_route(path, endpoint, methods=[method])
            app.add_api_route(f"{path}/", endpoint, methods=[method], include_in_schema=False)
            return endpoint

        return register

    app.add_middleware(AccessControl, policy=access)
    if access.cors_origins:  # outermost: answers preflights, and puts its headers on refusals too
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(access.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )

    @app.exception_handler(APIError)
    async def _api_error(_: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(HTTPException)
    async def _http_error(raw: Request, err: HTTPException) -> JSONResponse:  # 404, 405 in OpenAI's shape
        what = {404: f"no route {raw.method} {raw.url.path}", 405: f"{raw.url.path} does not take {raw.method}"}.get(
            err.status_code, str(err.detail)
        )
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return APIError(err.status_code, what, code=code, headers=dict(err.headers or {})).response()

    @_route("POST", "/v1/chat/completions")
    async def chat_completions(raw: Request) -> Response:
        return await handling.counted(
            "chat", handling.serve(raw, "chat", ChatCompletionRequest, chat_plan, chat_completion)
        )

    @_route("POST", "/v1/completions")
    async def completions(raw: Request) -> Response:
        return await handling.counted(
            "completions", handling.serve(raw, "completions", CompletionRequest, completion_plan, text_completion)
        )

    @_route("GET", "/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "fides-rag"}],
        }

    @_route("GET", "/health")
    async def health() -> JSONResponse:
        stats = decoder.stats
        body = {
            "status": "draining" if handling.draining else "ok",
            "queue_length": stats.queue_length,
            "requests_in_flight": stats.requests_in_flight,
        }
        return JSONResponse(body, status_code=503 if handling.draining else 200)

    @_route("GET", "/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
