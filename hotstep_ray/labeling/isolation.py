"""Run one per-sample call in a helper process, so a time limit can really stop it.

Essentia's extractors are C++ that hold the GIL: on some inputs (a NaN sample sends the key
extractor into a loop) they never return, and no thread, signal handler or `ray.get` timeout in
the same process can interrupt them. So the analysis runs in a child process — one long-lived
child per calling process (the `--no-ray` driver, or each Ray analysis actor), reused sample
after sample — and a call that overruns its limit gets the child killed; the next call starts a
fresh one. The same code bounds both label paths: a Ray actor runs the step, and the step runs
here.

The child is a plain `python -m hotstep_ray.labeling.isolation` talking over a socket pair, not a
`multiprocessing` child: those re-run the caller's main script, which breaks a script that
calls `label_dataset` without an `if __name__ == "__main__"` guard. While it works, the child
reports which stage it is in, so a timeout can say "key analysis took longer than ...".
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from hotstep_ray.core.errors import HotstepError

# Seconds a child may take to start and load a call (interpreter, the call's modules) before it
# counts as broken; not part of the call's own limit, which covers only running it.
_LOAD_S = 120.0
# Seconds the child gets past its limit before it takes itself down (see `_serve`); the parent
# kills it at the limit itself, this only matters when the parent died mid-call.
_SELF_KILL_GRACE_S = 5.0
_REAP_S = 5.0  # seconds to wait for a killed child to exit

Stage = Callable[[str], None]


class AnalysisTimeoutError(HotstepError):
    """A call ran past its time limit; its process was killed."""


class WorkerCrashedError(HotstepError):
    """The helper process died during a call (a crash in C code, killed from outside)."""


def _serve(conn: Connection) -> None:
    """The child's loop: receive `(fn, args, limit)`, say it is loaded, run `fn(*args, stage)`,
    send the outcome.

    Each call is also bounded from inside: SIGALRM with its default action ends the process in
    the kernel, without needing the GIL, so a child whose parent died mid-call (a killed Ray
    actor) does not spin on as an orphan. A parent that is gone between calls shows as EOF.
    """
    signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def stage(name: str) -> None:
        conn.send(("stage", name))

    while True:
        try:
            fn, args, limit_s = conn.recv()  # unpickling imports the call's modules
        except (EOFError, OSError):
            return
        except Exception as exc:  # the call cannot be loaded here (a module missing, ...)
            _send(conn, ("error", exc))
            continue
        conn.send(("loaded", None))
        signal.setitimer(signal.ITIMER_REAL, limit_s + _SELF_KILL_GRACE_S)
        try:
            outcome: tuple[str, Any] = ("ok", fn(*args, stage))
        except Exception as exc:
            outcome = ("error", exc)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            _send(conn, outcome)
        except OSError:  # the parent is gone: nobody wants the answer
            return


def _send(conn: Connection, outcome: tuple[str, Any]) -> None:
    try:
        conn.send(outcome)
    except OSError:
        raise
    except Exception as exc:  # an unpicklable result or exception: send its text instead
        conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))


class IsolatedWorker:
    """One helper process, started on first use, replaced after a timeout or a crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> Connection:
        if self._process is not None and self._process.poll() is None and self._conn is not None:
            return self._conn
        self.stop()
        ours, theirs = socket.socketpair()
        # The child imports what this process can (test modules, a Ray job's working dir), and
        # writes any stray output to stderr: stdout may be carrying a JSON report.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=sys.__stderr__.fileno() if sys.__stderr__ else subprocess.DEVNULL,
                env=env,
            )
        self._conn = Connection(ours.detach())
        return self._conn

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], limit_s: float) -> Any:
        """`fn(*args, stage)` in the helper process; raises what `fn` raised,
        `AnalysisTimeoutError` when running it takes over `limit_s` seconds (loading it does not
        count), or `WorkerCrashedError`."""
        if not (limit_s > 0 and math.isfinite(limit_s)):
            raise ValueError(f"time limit must be a finite number of seconds > 0, got {limit_s}")
        with self._lock:
            conn = self._start()
            conn.send((fn, args, limit_s))
            self._answer(conn, time.monotonic() + _LOAD_S, "loading", limit_s)  # "loaded"
            current = "starting"
            deadline = time.monotonic() + limit_s
            while True:
                kind, value = self._answer(conn, deadline, current, limit_s)
                if kind != "stage":
                    return value
                current = value

    def _answer(self, conn: Connection, deadline: float, current: str, limit_s: float) -> Any:
        """The child's next message before `deadline`; raises the child's error, or kills the
        child on a timeout or when it died."""
        left = deadline - time.monotonic()
        if left <= 0 or not conn.poll(left):
            self.stop()
            if current == "loading":
                raise WorkerCrashedError(f"the analysis process did not load within {_LOAD_S:g} s")
            raise AnalysisTimeoutError(
                f"{current} took longer than {limit_s:g} s (the analysis time limit)"
            )
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            code = self._reap()
            self.stop()
            raise WorkerCrashedError(
                f"the analysis process died during {current} (exit code {code})"
            ) from None
        except Exception as exc:  # sent, but not loadable here (e.g. an odd exception)
            raise RuntimeError(f"unreadable answer from the analysis process: {exc}") from exc
        if kind == "error":
            raise value
        return kind, value

    def _reap(self) -> int | None:
        try:
            return self._process.wait(_REAP_S) if self._process is not None else None
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Kill the helper process (if any); the next call starts a new one."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is not None:
            if process.poll() is None:
                process.kill()
            try:
                process.wait(_REAP_S)
            except subprocess.TimeoutExpired:
                pass


_WORKER = IsolatedWorker()
atexit.register(_WORKER.stop)  # an idle child would exit on its own (EOF); this is just sooner


def run_isolated(fn: Callable[..., Any], args: tuple[Any, ...], limit_s: float) -> Any:
    """`fn(*args, stage)` in this process's helper process, within `limit_s` seconds. `fn` and
    its arguments must pickle by reference (module-level functions, plain dataclasses)."""
    return _WORKER.call(fn, args, limit_s)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
