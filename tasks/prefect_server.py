"""The Prefect API server `autocompress serve` starts: Prefect's app behind a Host/Origin guard.

Run as ``python -m tasks.prefect_server --port N`` (always on 127.0.0.1). Prefect's own
settings do the rest, passed through the environment by ``autocompress serve``: basic
auth (``PREFECT_SERVER_API_AUTH_STRING``), CSRF tokens and CORS limited to the UI's origin.

Why a guard on top: a page in the user's browser can reach 127.0.0.1. A cross-origin
page sends its own ``Origin``; a DNS-rebinding page reaches us under its own host name,
so ``Host`` is not ours. Both are refused here (403) before Prefect sees the request,
as MLflow's server does, whatever the auth settings.
"""

from __future__ import annotations

import argparse
import json

import uvicorn
from prefect.server.api.server import create_app

from autocompress.serving import local_origins


def guarded(app, port: int):
    """``app`` with requests from another Host or a foreign Origin refused (403)."""
    origins = {origin.encode() for origin in local_origins(port)}
    hosts = {origin.removeprefix(b"http://") for origin in origins}

    async def guard(scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope.get("headers") or [])
            origin = headers.get(b"origin")
            if headers.get(b"host") not in hosts or (origin is not None
                                                     and origin not in origins):
                await _refuse(scope, send)
                return
        await app(scope, receive, send)

    return guard


async def _refuse(scope, send) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"detail": "refused: request from another host or origin "
                                 "(possible DNS rebinding or cross-site request)"}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()
    uvicorn.run(guarded(create_app(final=True), args.port), host="127.0.0.1", port=args.port,
                log_level=args.log_level)


if __name__ == "__main__":
    main()
