"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the matching HTTP status."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error answered to the client in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        message, param = _text(message), None if param is None else _text(param)
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _text(value: str) -> str:
    """`value` as text UTF-8 can encode: a lone surrogate (from a body's "\\udc80" escape, echoed in a field's path)
    is written as its escape, so the error itself can always be sent."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def validation_error(errors: list[dict[str, Any]], supported: list[str]) -> APIError:
    """A 400 from pydantic's errors: the first one named by its field path (`supported`: the request's fields)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body",)]
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        message = (
            f"unsupported field {param!r}: this server does not implement it; supported fields: {', '.join(supported)}"
        )
        return bad_request(message, param, "unsupported_field")
    where = f" at {param!r}" if param else ""
    return bad_request(f"invalid request{where}: {first.get('msg', 'invalid value')}", param, "invalid_value")
