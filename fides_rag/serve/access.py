"""Who may call the server: an API key on every route but `/health`, the Host header (a page that rebinds its DNS
name to 127.0.0.1 names its own host), JSON bodies only (a cross-site form or `text/plain` post is refused before it
decodes), and CORS only for the origins configured. Each refusal is in OpenAI's error shape."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from fides_rag.serve.errors import APIError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
OPEN_PATHS = frozenset({"/health", "/health/"})


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class AccessPolicy:
    """The server's access rules. `allowed_hosts` None accepts any Host header; `cors_origins` empty sends no CORS
    headers (browsers then keep other sites' pages from reading answers)."""

    api_key: str | None = None
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_HOSTS
    cors_origins: tuple[str, ...] = ()

    @classmethod
    def for_bind(
        cls,
        host: str,
        *,
        api_key: str | None = None,
        allowed_hosts: Sequence[str] | None = None,
        cors_origins: Sequence[str] = (),
    ) -> AccessPolicy:
        """The policy of a server bound to `host`: without `allowed_hosts`, the loopback names when bound to loopback,
        else any host (name them, or put a proxy that checks them in front)."""
        if allowed_hosts is None:
            hosts: tuple[str, ...] | None = LOOPBACK_HOSTS if is_loopback(host) else None
        else:
            hosts = None if "*" in allowed_hosts else tuple(h.lower() for h in allowed_hosts)
        return cls(api_key or None, hosts, tuple(cors_origins))

    def refusal(self, scope: Scope) -> APIError | None:
        """Why this HTTP request is refused, or None."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.allowed_hosts is not None and _hostname(headers.get("host", "")) not in self.allowed_hosts:
            return APIError(
                400,
                f"the Host header {headers.get('host', '')!r} is not one this server answers to; allowed: "
                f"{', '.join(self.allowed_hosts)} (the server's --allowed-hosts)",
                code="invalid_host",
            )
        if self.api_key is not None and scope.get("path") not in OPEN_PATHS:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
                return APIError(
                    401,
                    "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        if scope.get("method") == "POST":
            media = headers.get("content-type", "").partition(";")[0].strip().lower()
            if media != "application/json":
                return APIError(
                    415,
                    f"the request body must be application/json, got {media or 'no Content-Type'!r}",
                    code="unsupported_media_type",
                )
        return None


def _hostname(host: str) -> str:
    """The host part of a Host header ('[::1]:8000' -> '::1', 'Localhost:80' -> 'localhost')."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class AccessControl:
    """ASGI middleware applying an `AccessPolicy` to every HTTP request before it reaches a route."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = self.policy.refusal(scope)
            if refused is not None:
                await refused.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
