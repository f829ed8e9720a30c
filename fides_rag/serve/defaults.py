"""The server's defaults that the command line, the app and the Ray deployment share (no web framework imported)."""

from __future__ import annotations

API_KEY_ENV = "FIDES_RAG_API_KEY"
"""The environment variable `fides-rag serve` reads its API key from when --api-key is not given."""
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024
"""The largest request body a server accepts unless told otherwise (413 beyond)."""
