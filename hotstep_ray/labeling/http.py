"""A small HTTP client for the network providers: retries, Retry-After, call spacing.

stdlib `urllib` only, so the providers add no dependency. Rules (the seed's, for every provider):
408, 425, 429 and 5xx responses and network errors/timeouts are retried, `attempts` tries in all;
the wait honours `Retry-After` (seconds or an HTTP date) but never exceeds `max_wait_s` (15 s);
without the header it doubles from `backoff_s`. Other 4xx answers fail at once.

`min_interval_s` spaces the *starts* of calls (the seed's per-service rate limiter); a pool of N
copies of one client each spaces by N × the interval, so the pool keeps the global rate.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

RETRY_STATUSES = frozenset({408, 425, 429})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class ProviderError(Exception):
    """A provider call failed for good (after retries, or at once for a non-retryable answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]  # names lower-cased
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProviderError(f"malformed JSON from the provider: {exc}", self.status) from exc

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _lower(headers: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in (headers.items() if headers else ())}


def _retryable(status: int) -> bool:
    return status in RETRY_STATUSES or 500 <= status <= 599


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class _Spacer:
    """Spaces call starts by at least `interval_s`; thread-safe; rebuilt empty after pickling
    (each Ray actor gets its own)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._next = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["interval_s"])

    def wait(self, sleep: Callable[[float], None]) -> None:
        if self.interval_s <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval_s
        if start > now:
            sleep(start - now)


@dataclass
class HttpClient:
    timeout_s: float = 60.0
    attempts: int = 3
    backoff_s: float = 1.0
    max_wait_s: float = 15.0
    min_interval_s: float = 0.0
    sleep: Callable[[float], None] = time.sleep
    _spacer: _Spacer = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._spacer = _Spacer(self.min_interval_s)

    def for_concurrency(self, copies: int) -> HttpClient:
        """This client for one of `copies` parallel workers: same global call rate."""
        return replace(self, min_interval_s=self.min_interval_s * max(1, copies))

    def _open(self, request: urllib.request.Request):
        host = urllib.parse.urlsplit(request.full_url).hostname or ""
        # Loopback never goes through a proxy (tests' fake servers, local gateways).
        proxies = {} if host in _LOOPBACK else None
        opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies))
        return opener.open(request, timeout=self.timeout_s)

    def _once(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None):
        request = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
        try:
            with self._open(request) as response:
                return HttpResponse(response.status, _lower(response.headers), response.read())
        except urllib.error.HTTPError as exc:
            return HttpResponse(exc.code, _lower(exc.headers), exc.read() or b"")

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> HttpResponse:
        """One call with the retry rules above; returns a 2xx/3xx response or raises."""
        headers = headers or {}
        problem, status = "", None
        for attempt in range(self.attempts):
            self._spacer.wait(self.sleep)
            wait: float | None = None
            try:
                response = self._once(method, url, headers, body)
            except (
                urllib.error.URLError,
                TimeoutError,
                ConnectionError,
                http.client.HTTPException,
            ) as exc:
                problem = f"network error: {getattr(exc, 'reason', exc)}"
            else:
                if response.status < 400:
                    return response
                status = response.status
                problem = f"HTTP {status}: {response.text()[:200].strip()}"
                if not _retryable(status):
                    raise ProviderError(problem, status)
                wait = retry_after_s(response.header("Retry-After"))
            if attempt + 1 < self.attempts:
                if wait is None:
                    wait = self.backoff_s * 2**attempt
                self.sleep(min(wait, self.max_wait_s))
        raise ProviderError(f"gave up after {self.attempts} attempts ({problem})", status)

    def get(self, url: str, headers: Mapping[str, str] | None = None) -> HttpResponse:
        return self.request("GET", url, headers)

    def post_json(
        self, url: str, payload: Any, headers: Mapping[str, str] | None = None
    ) -> HttpResponse:
        body = json.dumps(payload).encode("utf-8")
        return self.request(
            "POST", url, {"Content-Type": "application/json", **(headers or {})}, body
        )
