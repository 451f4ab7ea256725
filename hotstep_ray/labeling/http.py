"""The network providers' HTTP client: `requests`, retried by urllib3's `Retry`, call spacing.

Rules (the seed's, for every provider): 408, 425, 429 and 5xx answers and network errors /
timeouts are retried, `attempts` tries in all; the wait honours `Retry-After` (seconds or an HTTP
date) but never exceeds `max_wait_s` (15 s); without the header it doubles from `backoff_s`
(1 s, 2 s, ...). Other 4xx answers fail at once. The retries run inside urllib3 (an
`HTTPAdapter(max_retries=Retry(...))`); `_ProviderRetry` only routes its waits through the
client's `sleep` and spacer, and starts the doubling at the first retry (urllib3's own first
retry does not wait). A body cut short after the headers arrived is not retried (urllib3
retries up to the response's headers).

`min_interval_s` spaces the *starts* of calls, retries included (the seed's per-service rate
limiter); a pool of N copies of one client each spaces by N x the interval, so the pool keeps the
global rate.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import InvalidHeader, MaxRetryError
from urllib3.util.retry import Retry

RETRY_STATUSES = frozenset({408, 425, 429, *range(500, 600)})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
# Loopback never goes through a proxy (tests' fake servers, local gateways); None drops the key.
_NO_PROXY = {"http": None, "https": None, "all": None}


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


class _ProviderRetry(Retry):
    """urllib3's Retry whose waits go through `pause` (the client's sleep, then its spacer)."""

    pause: Callable[[float], None] = time.sleep

    def new(self, **kw: Any) -> _ProviderRetry:
        fresh = super().new(**kw)
        fresh.pause = self.pause
        return fresh

    def get_backoff_time(self) -> float:
        # backoff_factor x 1, 2, 4, ... from the first retry on (urllib3: 0, then 2, 4, ...)
        errors = max(1, len(self.history))
        return float(min(self.backoff_max, self.backoff_factor * 2 ** (errors - 1)))

    def sleep(self, response: Any = None) -> None:
        wait = None
        if response is not None and self.respect_retry_after_header:
            try:
                wait = self.get_retry_after(response)  # capped at retry_after_max
            except InvalidHeader:
                wait = None  # unparseable Retry-After: the plain backoff
        self.pause(self.get_backoff_time() if wait is None else wait)


@dataclass
class HttpClient:
    timeout_s: float = 60.0
    attempts: int = 3
    backoff_s: float = 1.0
    max_wait_s: float = 15.0
    min_interval_s: float = 0.0
    sleep: Callable[[float], None] = time.sleep
    _spacer: _Spacer = field(init=False, repr=False, compare=False)
    _sessions: threading.local = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._spacer = _Spacer(self.min_interval_s)
        self._sessions = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_sessions"]  # sessions (pools, sockets) stay with the process that made them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._sessions = threading.local()

    def for_concurrency(self, copies: int) -> HttpClient:
        """This client for one of `copies` parallel workers: same global call rate."""
        return replace(self, min_interval_s=self.min_interval_s * max(1, copies))

    def _pause(self, wait: float) -> None:
        self.sleep(min(wait, self.max_wait_s))
        self._spacer.wait(self.sleep)

    def _session(self) -> requests.Session:
        """This thread's session (requests sessions are not shared across threads)."""
        session = getattr(self._sessions, "session", None)
        if session is None:
            retry = _ProviderRetry(
                total=max(0, self.attempts - 1),
                status_forcelist=RETRY_STATUSES,
                allowed_methods=None,  # POSTs too: every provider call is idempotent
                backoff_factor=self.backoff_s,
                backoff_max=self.max_wait_s,
                retry_after_max=self.max_wait_s,
                raise_on_status=False,  # out of retries: the last answer, to report below
            )
            retry.pause = self._pause
            adapter = HTTPAdapter(max_retries=retry)
            session = requests.Session()
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            self._sessions.session = session
        return session

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> HttpResponse:
        """One call with the retry rules above; returns a 2xx/3xx response or raises."""
        proxies = _NO_PROXY if (urlsplit(url).hostname or "") in _LOOPBACK else None
        self._spacer.wait(self.sleep)
        try:
            answer = self._session().request(
                method,
                url,
                headers=dict(headers or {}),
                data=body,
                timeout=self.timeout_s,
                proxies=dict(proxies) if proxies else None,
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise ProviderError(
                f"gave up after {self.attempts} attempts (network error: {_reason(exc)})"
            ) from exc
        except requests.RequestException as exc:
            raise ProviderError(f"request failed: {exc}") from exc
        response = HttpResponse(
            answer.status_code, {k.lower(): v for k, v in answer.headers.items()}, answer.content
        )
        if response.status < 400:
            return response
        problem = f"HTTP {response.status}: {response.text()[:200].strip()}"
        if response.status in RETRY_STATUSES:  # retryable, so urllib3 ran out of attempts
            raise ProviderError(
                f"gave up after {self.attempts} attempts ({problem})", response.status
            )
        raise ProviderError(problem, response.status)

    def get(self, url: str, headers: Mapping[str, str] | None = None) -> HttpResponse:
        return self.request("GET", url, headers)

    def post_json(
        self, url: str, payload: Any, headers: Mapping[str, str] | None = None
    ) -> HttpResponse:
        body = json.dumps(payload).encode("utf-8")
        return self.request(
            "POST", url, {"Content-Type": "application/json", **(headers or {})}, body
        )


def _reason(exc: Exception) -> str:
    """The underlying cause of a requests error (urllib3's MaxRetryError wraps it)."""
    cause = exc.args[0] if exc.args else exc
    if isinstance(cause, MaxRetryError) and cause.reason is not None:
        cause = cause.reason
    return str(cause)
