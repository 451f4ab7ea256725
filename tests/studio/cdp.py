"""Drive Debian's chromium through the DevTools protocol (a websocket; `websockets` is already
installed with uvicorn): no browser download, no driver package.

    with Chromium(binary, profile_dir) as page:
        page.navigate(url); page.wait_for("document.body.dataset.ready"); page.screenshot(path)
"""

from __future__ import annotations

import base64
import json
import queue
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

CHROMIUM_NAMES = ("chromium", "chromium-browser")
WINDOW = (1400, 1000)  # CSS px: the page's three columns side by side


def find_chromium() -> str | None:
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


class Chromium:
    # Seconds for Chromium to print its DevTools line. On a 2-core box where the other worker is
    # busy with a Ray job, a cold start has taken over 30 s; one retry covers a start that hung.
    START_TIMEOUT_S = 90.0
    START_ATTEMPTS = 2

    def __init__(
        self, binary: str, profile: Path, start_timeout_s: float = START_TIMEOUT_S
    ) -> None:
        self.binary, self.profile, self.timeout_s = binary, profile, start_timeout_s
        self.process: subprocess.Popen[str] | None = None
        self.socket: Any = None
        self._next_id = 0

    def __enter__(self) -> Chromium:
        port = self._start()
        deadline = time.monotonic() + self.timeout_s
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as reply:
                pages = [t for t in json.load(reply) if t.get("type") == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert pages, "chromium opened no page"
        self.socket = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self.send("Page.enable")
        self.send("Runtime.enable")
        return self

    def _start(self) -> int:
        """Launch Chromium and return its DevTools port, trying again once if a start hangs."""
        for attempt in range(1, self.START_ATTEMPTS + 1):
            self._launch(self.profile / f"attempt-{attempt}")
            try:
                return self._devtools_port()
            except RuntimeError:
                self._stop()
                if attempt == self.START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _launch(self, profile: Path) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--headless",
                "--no-sandbox",  # CI runs as root, where the sandbox cannot start
                "--disable-gpu",
                "--disable-dev-shm-usage",  # containers often give /dev/shm only 64 MB
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--mute-audio",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def _devtools_port(self) -> int:
        """Chromium prints `DevTools listening on ws://127.0.0.1:<port>/...` once it is up.

        stderr is read on a thread so the deadline holds even when Chromium goes quiet."""
        assert self.process is not None and self.process.stderr is not None
        lines: queue.Queue[str] = queue.Queue()
        stream = self.process.stderr
        threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
        deadline = time.monotonic() + self.timeout_s
        seen: list[str] = []
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            seen.append(line)
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                return int(found.group(1))
        raise RuntimeError(
            f"chromium did not start its DevTools endpoint in {self.timeout_s:.0f} s:\n"
            + "".join(seen[-20:])
        )

    def __exit__(self, *exc: object) -> None:
        if self.socket is not None:
            self.socket.close()
        self._stop()

    def _stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    # -- protocol ---------------------------------------------------------------------------------
    def send(self, method: str, timeout_s: float = 30.0, **params: Any) -> dict[str, Any]:
        """One command; its result (events that arrive meanwhile are skipped)."""
        self._next_id += 1
        message_id = self._next_id
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            reply = json.loads(self.socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("id") != message_id:
                continue
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply["result"]

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JS expression (promises awaited); JS exceptions raise."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        value = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # the page is between documents
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {expression} (last value {value!r})")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path
