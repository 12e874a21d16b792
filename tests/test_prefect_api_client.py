"""The stdlib Prefect API client (``autocompress.serving.PrefectAPI``) against a real HTTP
server on 127.0.0.1 that answers as a busy Prefect server does."""

from __future__ import annotations

import json
import threading
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from autocompress import serving


def serve_answers(codes: list[int]):
    """A server answering each request with the next of ``codes`` (200: a JSON body)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PATCH(self):  # noqa: N802 (http.server's name)
            seen.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            code = codes[min(len(seen), len(codes)) - 1]
            body = json.dumps({"ok": True}).encode() if code == 200 else b"busy"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(serving, "RETRY_WAIT_S", 0.01)


def test_a_busy_server_is_asked_again(quick_retries):
    """503 (sqlite locked under load), then 502: the call is retried and succeeds."""
    server, seen = serve_answers([503, 502, 200])
    try:
        api = serving.PrefectAPI(f"http://127.0.0.1:{server.server_port}/api", csrf={})
        assert api.call("/work_pools/accelerator", {"is_paused": False}, "PATCH") == {"ok": True}
        assert seen == ["/api/work_pools/accelerator"] * 3
    finally:
        server.shutdown()


def test_other_errors_and_a_server_that_stays_busy_are_raised(quick_retries):
    server, seen = serve_answers([404])
    try:
        api = serving.PrefectAPI(f"http://127.0.0.1:{server.server_port}/api", csrf={})
        with pytest.raises(urllib.error.HTTPError, match="404"):
            api.call("/x", {}, "PATCH")
        assert len(seen) == 1  # not retried
    finally:
        server.shutdown()
    server, seen = serve_answers([503])
    try:
        api = serving.PrefectAPI(f"http://127.0.0.1:{server.server_port}/api", csrf={})
        with pytest.raises(urllib.error.HTTPError, match="503"):
            api.call("/x", {}, "PATCH")
        assert len(seen) == serving.RETRIES + 1
    finally:
        server.shutdown()
