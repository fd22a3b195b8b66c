"""Goodput of a full agent under overload: successes per second, and the share of callers served.

    .venv/bin/python bench/overload.py steady [--seconds 20] [--compare-src /tmp/old/src ...]
    .venv/bin/python bench/overload.py vary   # answer times spread 0.2-1.8 s, same arrivals
    .venv/bin/python bench/overload.py under  # spread answers at 80% of capacity: nothing lost
    .venv/bin/python bench/overload.py full   # spread answers at 100% of capacity
    .venv/bin/python bench/overload.py burst  # 20 calls at once, then 1.5 a second (75%)

One agent of ``max_concurrency: 2`` whose handler takes 1 s (``vary``: uniform 0.2-1.8 s), called
through the Router at 4 a second (2x its capacity; ``under``: 1.6, ``full``: 2) with ``timeoutMs:
2500``, for ``--seconds``. Two calls go first, one after the other, so the agent's usual answer
time is known. The Router (``python -m reachmesh router``) and the agent (this file, ``agent``)
run in processes of their own; the Router runs this tree's ``src`` and then each
``--compare-src`` in turn (PYTHONPATH), each with a fresh agent, in the same run.

Per tree: the statuses, goodput (successes over the time from the first call to the last
answer), the share served, the successes' p50, and at the agent: the requests it received and
how many of them it worked on past their caller's deadline (``X-Reach-Deadline-Ms`` shorter than
its answer time: work for nobody). Prints one JSON line per tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from servers import Server, free_port, http

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

# name: (answer time s, spread as a share of it, arrivals per s, calls at once first, timeoutMs)
SCENARIOS: dict[str, tuple[float, float, float, int, int]] = {
    "steady": (1.0, 0.0, 4.0, 0, 2500),
    "vary": (1.0, 0.8, 4.0, 0, 2500),
    "under": (1.0, 0.8, 1.6, 0, 2500),
    "full": (1.0, 0.8, 2.0, 0, 2500),
    "burst": (1.0, 0.0, 1.5, 20, 2500),
}
CAPACITY = 2


def agent_main(port: int, hold_s: float, spread: float) -> None:
    """The agent: answers after ``hold_s`` (uniform within +-``spread`` of it), counting what it got."""
    from aiohttp import web

    state = {"received": 0, "late": 0}
    draw = random.Random(7)

    async def reach(request: web.Request) -> web.Response:
        await request.read()
        hold = draw.uniform(hold_s * (1 - spread), hold_s * (1 + spread))
        state["received"] += 1
        if hold * 1000 > float(request.headers.get("X-Reach-Deadline-Ms", "inf")):
            state["late"] += 1  # its caller will be gone before it answers
        await asyncio.sleep(hold)
        return web.json_response({"status": "SUCCESS", "result": {"ok": True}})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(state)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/reach", reach)
    app.router.add_get("/stats", stats)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def one_call(session: aiohttp.ClientSession, url: str, timeout_ms: int) -> tuple[str, float, float]:
    """(status, sent at, seconds taken) of one call through the Router."""
    body = {"targetTask": "slow", "payload": {}, "preferences": {"timeoutMs": timeout_ms}}
    sent = time.monotonic()
    try:
        async with session.post(url, json=body) as answer:
            status = str((await answer.json()).get("status"))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        status = f"client:{type(exc).__name__}"
    return status, sent, time.monotonic() - sent


async def load(url: str, scenario: str, seconds: float) -> dict[str, Any]:
    _, _, rate, at_once, timeout_ms = SCENARIOS[scenario]
    client_timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000 + 10)
    async with aiohttp.ClientSession(
        timeout=client_timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        for _ in range(2):  # the agent's usual answer time, known before the load
            await one_call(session, url, 10_000)
        began = time.monotonic()
        calls = [asyncio.ensure_future(one_call(session, url, timeout_ms)) for _ in range(at_once)]
        for index in range(int(seconds * rate)):
            await asyncio.sleep(max(began + index / rate - time.monotonic(), 0.0))
            calls.append(asyncio.ensure_future(one_call(session, url, timeout_ms)))
        done = await asyncio.gather(*calls)
    ended = max(sent + took for _, sent, took in done)
    statuses: dict[str, int] = {}
    for status, _, _ in done:
        statuses[status] = statuses.get(status, 0) + 1
    served = sorted(took for status, _, took in done if status == "SUCCESS")
    return {
        "calls": len(done),
        "statuses": statuses,
        "goodput_per_s": round(len(served) / (ended - began), 2),
        "served_share": round(len(served) / len(done), 3),
        "success_p50_s": round(served[len(served) // 2], 2) if served else None,
    }


def run_tree(src: Path, scenario: str, seconds: float, tmp: Path) -> dict[str, Any]:
    hold_s, spread, *_ = SCENARIOS[scenario]
    config = tmp / "router.yaml"
    policy = {"embedding": {"backend": "none"}, "health": {"enabled": False}, "logging": {"level": "WARNING"}}
    config.write_text(yaml.safe_dump(policy))
    router_port, agent_port = free_port(), free_port()
    argv = [sys.executable, "-m", "reachmesh", "router", "--port", str(router_port), "--config", str(config)]
    router = Server("router", argv, tmp / "router.log", env={"PYTHONPATH": str(src)})
    agent_argv = [sys.executable, __file__, "agent", str(agent_port), str(hold_s), str(spread)]
    agent = Server("agent", agent_argv, tmp / "agent.log")
    base, agent_url = f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{agent_port}"
    try:
        router.start()
        agent.start()
        router.wait_ready(lambda: http("GET", f"{base}/readyz")[0] == 200, 60)
        agent.wait_ready(lambda: http("GET", f"{agent_url}/healthz")[0] == 200, 30)
        profile = {
            "id": "busy",
            "network": {"endpoint": f"{agent_url}/reach"},
            "capabilities": [{"task": "slow"}],
            "max_concurrency": CAPACITY,
        }
        status, answer = http("POST", f"{base}/agents", profile)
        if status not in (200, 201):
            raise RuntimeError(f"registration: {status} {answer}")
        out = {"src": str(src), "scenario": scenario, **asyncio.run(load(f"{base}/reach", scenario, seconds))}
        at_agent = http("GET", f"{agent_url}/stats")[1]
        out["agent_received"], out["agent_worked_past_deadline"] = at_agent["received"] - 2, at_agent["late"]
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
            metrics = resp.read().decode().splitlines()
        out["not_sent"] = sum(
            float(x.rsplit(" ", 1)[1]) for x in metrics if x.startswith("reach_not_sent_total{")
        )
        out["circuit"] = http("GET", f"{base}/admin/agents/busy")[1].get("circuit")
        return out
    finally:
        agent.stop()
        router.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "agent":
        agent_main(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--compare-src", action="append", default=[], help="another tree's src, run after")
    args = parser.parse_args()
    for src in [SRC, *map(Path, args.compare_src)]:
        with tempfile.TemporaryDirectory() as name:
            print(json.dumps(run_tree(src, args.scenario, args.seconds, Path(name))), flush=True)


if __name__ == "__main__":
    main()
