"""The baseline: the least a Python forwarder on the Router's stack can do per request.

Same server (uvicorn, uvloop, httptools) and client (one shared aiohttp session) as the Router,
same decode and re-encode of the envelope, and nothing else: no validation, routing, retries,
timeouts of its own, stats or logs. Router cost above this is the cost of the Router's features.

    python bench/passthrough_proxy.py PORT [AGENT_URL]    (or AGENT_URL in $BENCH_AGENT_URL)
"""

from __future__ import annotations

import os
import sys
from typing import Any

import aiohttp
import orjson
import uvicorn

AGENT_URL = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("BENCH_AGENT_URL", "")
FORWARD_HEADERS = {"Content-Type": "application/json"}
state: dict[str, aiohttp.ClientSession] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # The session binds to the running loop, so it can only be made here.
                state["session"] = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await state["session"].close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    envelope = orjson.loads(b"".join(chunks))
    async with state["session"].post(AGENT_URL, data=orjson.dumps(envelope), headers=FORWARD_HEADERS) as resp:
        answer, status = await resp.read(), resp.status
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


if __name__ == "__main__":
    if not AGENT_URL:
        sys.exit("usage: passthrough_proxy.py PORT AGENT_URL (or set BENCH_AGENT_URL)")
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        server_header=False,
    )
