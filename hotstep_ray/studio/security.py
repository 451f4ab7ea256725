"""The studio's three guards: allowed roots for every path a request names, the optional bearer
token, and a request body cap.

Paths: a request may name a local folder or a URL (`s3://bucket/x`). A local path must be absolute,
may not contain `..`, and is resolved (symlinks followed) before the check, so a symlink inside an
allowed root that points elsewhere is refused like the target itself. URLs are compared after
normalising, on whole path segments (`s3://b/data` does not allow `s3://b/database`).
"""

from __future__ import annotations

import hmac
import posixpath
from collections.abc import Iterable
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hotstep_ray.core.errors import InputError, PathNotAllowedError


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _normalise_root(root: str) -> str:
    if _is_url(root):
        scheme, rest = root.split("://", 1)
        return f"{scheme}://{posixpath.normpath(rest).rstrip('/')}"
    return str(Path(root.removeprefix("file://")).expanduser().resolve())


class PathGuard:
    """Checks that a path lies inside one of `roots`; returns its canonical form."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = tuple(dict.fromkeys(_normalise_root(r) for r in roots if r))

    def check(self, raw: str, what: str = "path") -> str:
        raw = (raw or "").strip()
        if not raw:
            raise InputError(f"{what} is empty")
        if "\x00" in raw:
            raise InputError(f"{what} contains a NUL byte")
        if ".." in raw.replace("\\", "/").split("/"):
            raise PathNotAllowedError(f"{what} may not contain '..': {raw}")
        if _is_url(raw):
            return self._check_url(raw, what)
        local = Path(raw.removeprefix("file://")).expanduser()
        if not local.is_absolute():
            raise InputError(f"{what} must be an absolute path or a URL, got {raw!r}")
        resolved = local.resolve()  # follows symlinks: an escape through a link is caught here
        for root in self.roots:
            if not _is_url(root) and resolved.is_relative_to(root):
                return str(resolved)
        raise PathNotAllowedError(f"{what} {raw} is outside the allowed roots")

    def _check_url(self, raw: str, what: str) -> str:
        scheme, rest = raw.split("://", 1)
        url = f"{scheme}://{posixpath.normpath(rest)}"
        for root in self.roots:
            if _is_url(root) and (url == root or url.startswith(root.rstrip("/") + "/")):
                return url
        raise PathNotAllowedError(f"{what} {raw} is outside the allowed roots")


def token_matches(expected: str, authorization: str | None, query_token: str | None) -> bool:
    """Constant-time check of `Authorization: Bearer <token>` (or the query token, which only
    the SSE route accepts: browsers' EventSource cannot send headers)."""
    if not expected:
        return True
    supplied = ""
    if authorization and authorization.lower().startswith("bearer "):
        supplied = authorization[7:].strip()
    elif query_token:
        supplied = query_token
    return bool(supplied) and hmac.compare_digest(supplied.encode(), expected.encode())


class BodyTooLarge(HTTPException):
    """Raised while reading an oversized body. An HTTPException, so FastAPI's body parsing (which
    turns other read errors into 400) lets it through as 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request body over {max_bytes} bytes")


class BodyLimitMiddleware:
    """Answers 413 to a request whose body exceeds `max_bytes`, by Content-Length when given and
    by counting otherwise (a chunked upload cannot sneak past the header check)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _send_413(send, self.max_bytes)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _send_413(send, self.max_bytes)


async def _send_413(send: Send, max_bytes: int) -> None:
    body = f'{{"error":"request body over {max_bytes} bytes"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})
