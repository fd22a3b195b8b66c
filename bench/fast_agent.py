"""The benchmark's agent: answers every POST with a fixed SUCCESS, as cheaply as uvicorn allows.

It does no work of its own, so whatever a path costs on top of it is the cost of that path.
Raw ASGI rather than the SDK, because the SDK's own overhead is not what is being measured.

    python bench/fast_agent.py PORT
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

BODY = b'{"status":"SUCCESS","result":{"ok":true}}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]
START = {"type": "http.response.start", "status": 200, "headers": HEADERS}
REPLY = {"type": "http.response.body", "body": BODY}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    # Drain the body so the connection is clean for the next keep-alive request.
    message = await receive()
    while message.get("more_body"):
        message = await receive()
    await send(START)
    await send(REPLY)


def main() -> None:
    port = int(sys.argv[1])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
    )


if __name__ == "__main__":
    main()
