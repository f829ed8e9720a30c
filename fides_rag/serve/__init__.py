"""`fides-rag serve`: an OpenAI-compatible HTTP server on the decode engine (the `serve` extra).

`build_app(decoder, model_name=...)` is the FastAPI app; `fides-rag serve --model NAME` runs it under uvicorn.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_app"]

API_KEY_ENV = "FIDES_RAG_API_KEY"
"""The environment variable `fides-rag serve` reads its API key from when --api-key is not given."""
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024
"""The largest request body a server accepts unless told otherwise (413 beyond)."""


def __getattr__(name: str) -> Any:
    if name == "build_app":  # imported on use: the command line must load without the serve extra
        from fides_rag.serve.app import build_app

        return build_app
    raise AttributeError(name)
