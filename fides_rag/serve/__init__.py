"""`fides-rag serve`: an OpenAI-compatible HTTP server on the decode engine (the `serve` extra).

`build_app(decoder, model_name=...)` is the FastAPI app; `fides-rag serve --model NAME` runs it under uvicorn.
"""

from __future__ import annotations

from typing import Any

from fides_rag.serve.defaults import API_KEY_ENV, DEFAULT_MAX_REQUEST_BYTES

__all__ = ["API_KEY_ENV", "DEFAULT_MAX_REQUEST_BYTES", "build_app"]


def __getattr__(name: str) -> Any:
    if name == "build_app":  # imported on use: the command line must load without the serve extra
        from fides_rag.serve.app import build_app

        return build_app
    raise AttributeError(name)
