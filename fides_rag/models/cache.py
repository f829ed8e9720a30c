"""The user's cache folder for converted and fetched models."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "FIDES_RAG_CACHE"


def cache_root() -> Path:
    """Where converted models are kept: $FIDES_RAG_CACHE, else ~/.cache/fides-rag."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fides-rag")
