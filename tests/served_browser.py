"""Headless Chromium over the DevTools protocol, for the served test's UI checks.

``chromium --dump-dom`` cannot log in: the Prefect UI keeps the API password in the
page's localStorage (``prefect-password``, base64 of the ``user:password`` string the
login page asks for). Driving the browser over its DevTools websocket can: open the UI's
origin, store the password as the login page would, then open the page and read its text.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from autocompress.serving import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium and its first tab; ``with Browser(profile) as b: ...``."""

    def __init__(self, profile: Path, start_timeout: float = 60.0):
        port = free_port()
        argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                f"--remote-debugging-port={port}", "--window-size=1400,900", "about:blank"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.ids = itertools.count(1)
        self.socket = self._connect(port, start_timeout)

    def _connect(self, port: int, timeout: float):
        from websockets.sync.client import connect

        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                            timeout=5) as response:
                    pages = [t for t in json.loads(response.read()) if t["type"] == "page"]
                if pages:
                    return connect(pages[0]["webSocketDebuggerUrl"], max_size=None)
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"headless Chromium did not open its DevTools port {port}")
            time.sleep(0.5)

    def send(self, method: str, **params):
        """Call a DevTools method and return its result (events in between are skipped)."""
        call_id = next(self.ids)
        self.socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str):
        return self.send("Runtime.evaluate", expression=expression,
                         returnByValue=True)["result"].get("value")

    def text_with(self, needles: list[str], timeout: float = 60.0) -> str:
        """The page's visible text once it contains every one of ``needles``."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.evaluate("document.body ? document.body.innerText : ''") or ""
            if all(needle in text for needle in needles):
                return text
            time.sleep(1.0)
        missing = [n for n in needles if n not in text]
        raise AssertionError(f"the page never showed {missing}; it showed:\n{text[-3000:]}")

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def log_in_to_prefect(self, ui_url: str, auth_string: str) -> None:
        """What the Prefect UI's login page does with the password typed into it."""
        self.goto(ui_url)
        self.text_with([], timeout=5)  # let the origin's page start
        secret = base64.b64encode(auth_string.encode()).decode()
        self.evaluate(f"localStorage.setItem('prefect-password', {json.dumps(secret)})")

    def close(self) -> None:
        try:
            self.socket.close()
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
