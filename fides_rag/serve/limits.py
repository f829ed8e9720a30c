"""What one request may hold: its body's size and JSON nesting, its documents' tokens, and whether documents that
do not fit the context window are refused (the default) or trimmed (recorded as `documents_trimmed`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from fides_rag.serve.defaults import DEFAULT_MAX_REQUEST_BYTES
from fides_rag.serve.errors import APIError, bad_request
MAX_JSON_DEPTH = 64
"""OpenAI's bodies nest a handful of levels (messages, content parts, tool schemas); deeper is refused."""


@dataclass(frozen=True)
class RequestLimits:
    """A server's limits on one request."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_json_depth: int = MAX_JSON_DEPTH
    max_document_tokens: int | None = None
    """The documents' tokens together (None: bounded by the context window only)."""
    trim_documents: bool = False
    """Trim documents that do not fit the context window (else the request gets a 400 saying so)."""

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_json_depth", "max_document_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    async def read_body(self, raw: Request) -> bytes:
        """The body, refused with 413 as soon as it passes `max_request_bytes` (declared or streamed)."""
        declared = raw.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_request_bytes:
            raise self._too_large()
        chunks, size = [], 0
        async for chunk in raw.stream():
            size += len(chunk)
            if size > self.max_request_bytes:
                raise self._too_large()
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than this server's limit of {self.max_request_bytes} bytes; send fewer or "
                             "shorter documents (the server's --max-request-bytes sets the limit)", code="request_too_large")

    def parse(self, body: bytes) -> dict[str, Any]:
        """The body as a JSON object: invalid JSON, NaN/Infinity, numbers too long, nesting deeper than
        `max_json_depth` and anything but an object are each refused with a 400."""
        try:
            payload = json.loads(body, parse_constant=_refuse_constant)
        except RecursionError:
            raise self._too_deep() from None
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, integers past Python's digit limit
            raise APIError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None
        if not isinstance(payload, dict):
            raise bad_request("the request body must be a JSON object")
        _check_tree(payload, self.max_json_depth)
        return payload

    def _too_deep(self) -> APIError:
        return _too_deep(self.max_json_depth)

    def check_documents(self, tokenizer: Any, texts: Sequence[str], context_window: int, max_new_tokens: int) -> None:
        """Refuse (400) documents past `max_document_tokens`, or, unless trimming is allowed, documents that alone
        leave no room in the context window for the answer (cheaper than planning them to find out)."""
        if not texts or (self.max_document_tokens is None and self.trim_documents):
            return
        tokens = sum(len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"])
        if self.max_document_tokens is not None and tokens > self.max_document_tokens:
            raise bad_request(f"the documents hold {tokens} tokens, more than this server's limit of {self.max_document_tokens} "
                              "(--max-document-tokens); send fewer or shorter documents", "documents", "documents_too_long")
        if not self.trim_documents and tokens + max_new_tokens > context_window:
            raise self._not_fitting(f"the documents alone hold {tokens} tokens")

    def check_trimmed(self, trimmed: bool) -> None:
        """Refuse (400) a request whose documents had to be trimmed to fit, unless trimming is allowed."""
        if trimmed and not self.trim_documents:
            raise self._not_fitting("the prompt with its documents")

    @staticmethod
    def _not_fitting(what: str) -> APIError:
        return bad_request(f"{what} and max_tokens do not fit the model's context window; send fewer or shorter documents or "
                           "lower max_tokens (a server started with --trim-documents trims them instead, and says so in "
                           "the record's documents_trimmed)", "documents", "context_length_exceeded")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _too_deep(limit: int) -> APIError:
    return APIError(400, f"the request body nests deeper than {limit} levels", code="invalid_json")


def _check_tree(value: Any, limit: int) -> None:
    """Refuse (400) nesting past `limit` levels and strings that are not Unicode text (a lone surrogate such as
    "\\ud800" is valid JSON but no character); walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                raise APIError(400, f"a string in the request body holds a lone surrogate ({item[err.start]!r}), which is not text",
                               code="invalid_json") from None
        elif isinstance(item, (dict, list)):
            if depth > limit:
                raise _too_deep(limit)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
