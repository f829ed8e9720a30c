"""What one request may hold: its body's size and JSON nesting, its documents' tokens, and whether documents that
do not fit the context window are refused (the default) or trimmed (recorded as `documents_trimmed`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request

from fides_rag.serve.defaults import DEFAULT_MAX_REQUEST_BYTES
from fides_rag.serve.errors import APIError, bad_request

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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
        return APIError(
            413,
            f"the request body is larger than this server's limit of {self.max_request_bytes} bytes; send fewer or "
            "shorter documents (the server's --max-request-bytes sets the limit)",
            code="request_too_large",
        )

    def parse(self, body: bytes) -> dict[str, Any]:
        """The body as a JSON object: invalid JSON, NaN/Infinity, numbers too long or too large, nesting deeper than
        `max_json_depth` and anything but an object are each refused with a 400 (naming the field where there is
        one)."""
        try:
            payload = json.loads(
                body, parse_constant=_Refused.constant, parse_int=_Refused.integer, parse_float=_Refused.number
            )
        except RecursionError:
            raise self._too_deep() from None
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
            raise APIError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None
        if not isinstance(payload, dict):
            raise bad_request("the request body must be a JSON object")
        _check_tree(payload, self.max_json_depth)
        return payload

    def _too_deep(self) -> APIError:
        return _too_deep(self.max_json_depth)

    def check_documents(
        self, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], context_window: int, max_new_tokens: int
    ) -> None:
        """Refuse (400) documents past `max_document_tokens`, or, unless trimming is allowed, documents that alone
        leave no room in the context window for the answer (cheaper than planning them to find out)."""
        if not texts or (self.max_document_tokens is None and self.trim_documents):
            return
        tokens = sum(len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"])
        if self.max_document_tokens is not None and tokens > self.max_document_tokens:
            raise bad_request(
                f"the documents hold {tokens} tokens, more than this server's limit of {self.max_document_tokens} "
                "(--max-document-tokens); send fewer or shorter documents",
                "documents",
                "documents_too_long",
            )
        if not self.trim_documents and tokens + max_new_tokens > context_window:
            raise self._not_fitting(f"the documents alone hold {tokens} tokens")

    def check_trimmed(self, trimmed: bool) -> None:
        """Refuse (400) a request whose documents had to be trimmed to fit, unless trimming is allowed."""
        if trimmed and not self.trim_documents:
            raise self._not_fitting("the prompt with its documents")

    @staticmethod
    def _not_fitting(what: str) -> APIError:
        return bad_request(
            f"{what} and max_tokens do not fit the model's context window; send fewer or shorter documents or "
            "lower max_tokens (a server started with --trim-documents trims them instead, and says so in "
            "the record's documents_trimmed)",
            "documents",
            "context_length_exceeded",
        )


class _Refused:
    """A value the JSON text holds but a request may not (NaN, Infinity, an integer past Python's digit limit, a number
    too large for a float): parsed as this marker, so the tree walk can name the field that holds it."""

    def __init__(self, what: str) -> None:
        self.what = what

    @classmethod
    def constant(cls, name: str) -> _Refused:
        return cls(f"{name} is not a JSON number (JSON has no NaN or Infinity)")

    @classmethod
    def integer(cls, text: str) -> int | _Refused:
        try:
            return int(text)
        except ValueError:  # past sys.get_int_max_str_digits()
            return cls(f"an integer of {len(text.lstrip('-'))} digits is too long")

    @classmethod
    def number(cls, text: str) -> float | _Refused:
        value = float(text)
        return value if math.isfinite(value) else cls(f"{text[:32]} is too large for a number")


def _too_deep(limit: int, param: str | None = None) -> APIError:
    return APIError(400, f"the request body nests deeper than {limit} levels", param=param, code="invalid_json")


def _param(path: tuple[Any, ...]) -> str | None:
    """A field's path as pydantic names it in its errors (messages.0.content)."""
    return ".".join(str(part) for part in path) or None


def _check_tree(value: object, limit: int) -> None:
    """Refuse (400, naming the field) nesting past `limit` levels, the values `_Refused` marks, and strings that are
    not Unicode text (a lone surrogate such as "\\ud800" is valid JSON but no character); walked without recursion."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 1, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, _Refused):
            raise APIError(
                400, f"invalid request at {_param(path)!r}: {item.what}", param=_param(path), code="invalid_json"
            )
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as err:
                raise APIError(
                    400,
                    f"a string in the request body holds a lone surrogate ({item[err.start]!r}), which is not text",
                    param=_param(path),
                    code="invalid_json",
                ) from None
        elif isinstance(item, (dict, list)):
            if depth > limit:
                raise _too_deep(limit, _param(path))
            children = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((child, depth + 1, (*path, key)) for key, child in children)
            if isinstance(item, dict):
                stack.extend((key, depth, (*path, key)) for key in item)
