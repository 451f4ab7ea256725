"""The FastAPI shell every Serve application of ours shares (audition, MM3 audition).

One place for what a client sees before a route runs: an optional bearer token on every path but
the public ones (compared in constant time), a Content-Length cap on bodies (411 without one, 413
over it), and errors as `{"error": "..."}` with the status `audition.errors.http_status` picks —
validation problems as one 422 line naming each field, plus the structured detail.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hotstep_ray.audition.errors import http_status
from hotstep_ray.core.errors import HotstepError

TOKEN_ENV = "HOTSTEP_TOKEN"
PUBLIC_PATHS = ("/health", "/docs", "/openapi.json", "/redoc", "/docs/oauth2-redirect")
BODY_METHODS = ("POST", "PUT", "PATCH")


def error_response(exc: BaseException) -> JSONResponse:
    return JSONResponse({"error": str(exc) or type(exc).__name__}, status_code=http_status(exc))


def guarded_api(*, title: str, description: str, token: str | None, max_body_bytes: int) -> FastAPI:
    """A FastAPI app with the token guard, the body cap and the error mapping installed.
    `token` None reads $HOTSTEP_TOKEN (at build time); "" turns the guard off."""
    api = FastAPI(title=title, description=description, version="0.1.0")
    secret = token if token is not None else os.environ.get(TOKEN_ENV) or ""
    expected = f"Bearer {secret}".encode()

    @api.middleware("http")
    async def guard(request: Request, call_next):
        if secret and request.url.path not in PUBLIC_PATHS:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401)
        if request.method in BODY_METHODS:
            length = request.headers.get("content-length")
            if length is None or not length.isdigit():
                return JSONResponse({"error": "a Content-Length header is required"}, 411)
            if int(length) > max_body_bytes:
                return JSONResponse(
                    {
                        "error": f"request body of {length} bytes exceeds the "
                        f"{max_body_bytes}-byte cap"
                    },
                    413,
                )
        return await call_next(request)

    @api.exception_handler(HotstepError)
    async def hotstep_error(_request: Request, exc: HotstepError):
        return error_response(exc)

    @api.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, exc: RequestValidationError):
        detail = [
            {
                "loc": [str(p) for p in e.get("loc", ())],
                "msg": str(e.get("msg")),
                "type": e.get("type"),
            }
            for e in exc.errors()
        ]
        problems = [f"{'.'.join(d['loc'][1:]) or 'body'}: {d['msg']}" for d in detail]
        return JSONResponse({"error": "; ".join(problems), "detail": detail}, 422)

    return api


async def remote(response: Any) -> Any:
    """Await a Serve handle call; a HotstepError raised in a replica comes back as itself (so it
    maps to its 4xx), not wrapped in Ray's task error."""
    try:
        return await response
    except HotstepError:
        raise
    except Exception as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, HotstepError):
            raise cause from None
        raise
