"""The burst benchmark's agent: answers every POST after HOLD seconds, and counts its peak.

    python bench/slow_agent.py PORT HOLD_S [BACKLOG]

BACKLOG is its listen backlog: aiohttp's default, 128, unless given.

aiohttp, as in the issue's report. ``GET /peak`` answers the most requests it held at once, how
many it received in all, and ``arrivals``: when each request arrived (epoch seconds, the first
20,000), so a bench can tell time spent before the agent from time spent in it; ``POST
/peak/reset`` clears them. ``GET /healthz`` answers 200.
"""

from __future__ import annotations

import asyncio
import sys
import time

from aiohttp import web

BODY = b'{"status":"SUCCESS","result":{"ok":true}}'


def main() -> None:
    port, hold = int(sys.argv[1]), float(sys.argv[2])
    backlog = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    state = {"now": 0, "peak": 0, "received": 0}
    arrivals: list[float] = []

    async def reach(request: web.Request) -> web.Response:
        await request.read()
        if len(arrivals) < 20_000:
            arrivals.append(time.time())
        state["now"] += 1
        state["received"] += 1
        state["peak"] = max(state["peak"], state["now"])
        try:
            await asyncio.sleep(hold)
        finally:
            state["now"] -= 1
        return web.Response(body=BODY, content_type="application/json")

    async def peak(request: web.Request) -> web.Response:
        return web.json_response({**state, "arrivals": arrivals})

    async def reset(request: web.Request) -> web.Response:
        state.update(peak=0, received=0)
        arrivals.clear()
        return web.json_response(state)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/reach", reach)
    app.router.add_get("/peak", peak)
    app.router.add_post("/peak/reset", reset)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, backlog=backlog)


if __name__ == "__main__":
    main()
