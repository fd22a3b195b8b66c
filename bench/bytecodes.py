"""Python bytecodes the Router executes per /reach call: a cost figure that outside load cannot move.

On the shared 2-core machine, CPU per request under wrk moved by +-25 % between rounds of the same
tree while other work ran, more than most single changes to the hot path save. The number of
bytecodes executed does not depend on the load, so it shows what a change to Python code saves
(or costs) in one run. It does not count C work (orjson, pydantic-core, httptools, uvloop, system
calls): read it beside CPU per request (``router_overhead.py``) and ``strace -c``, not instead.

A Router (every default on, INFO trace lines to /dev/null) is served by uvicorn with the Router's
own HTTP/1.1 protocol and uvloop, in this process; bench/fast_agent.py answers in another. A
client process sends ``--requests`` calls over ``--connections`` keep-alive connections after a
warm-up; ``sys.settrace`` with opcode events counts every bytecode the server runs meanwhile::

    .venv/bin/python bench/bytecodes.py
    .venv/bin/python bench/bytecodes.py --top 40          # the functions that run the most
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/bytecodes.py   # another tree's Router
    .venv/bin/python bench/bytecodes.py --observability off   # tracing and metrics off
    .venv/bin/python bench/bytecodes.py --auth            # auth on, calls with a caller token

Tracing slows the Router about fifty-fold, so a few hundred calls are plenty.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from servers import answers_success, free_port  # noqa: E402

REQUEST = b'{"targetTask": "echo", "payload": {"n": 1}}'
PROFILE = {
    "id": "bench-agent",
    "capabilities": [{"task": "echo", "input_schema": {"n": "integer"}}],
}

# The client: plain sockets and threads, so none of its work is in the Router's count.
CLIENT = r"""
import socket, sys, threading
port, count, conns, body = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
head = b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
if len(sys.argv) > 5:
    head += b"Authorization: Bearer " + sys.argv[5].encode() + b"\r\n"
call = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
def run(n):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(n):
            sock.sendall(call)
            got = b""
            while True:
                got += sock.recv(65536)
                head, sep, rest = got.partition(b"\r\n\r\n")
                if sep:
                    size = [l for l in head.lower().split(b"\r\n") if l.startswith(b"content-length")]
                    if len(rest) >= int(size[0].split(b":")[1]):
                        break
            if b'"SUCCESS"' not in rest:
                sys.exit("not a SUCCESS: " + got[:300].decode("latin-1"))
threads = [threading.Thread(target=run, args=(count // conns,)) for _ in range(conns)]
for t in threads: t.start()
for t in threads: t.join()
"""


class Counter:
    """Bytecodes executed, per (file, function)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            where = code.co_filename.split("/src/")[-1].split("site-packages/")[-1]
            self.counts[(where, code.co_name)] += 1
        return self.trace


async def client(port: int, count: int, connections: int, token: str | None = None) -> None:
    args = [str(port), str(count), str(connections), REQUEST.decode(), *([token] if token else [])]
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, *args)
    if await proc.wait() != 0:
        raise RuntimeError("the client's calls did not all succeed")


# router_overhead.py's router-bare: the trace store and metrics not fed (trace lines still written).
OFF = {"tracing": {"enabled": False, "store_size": 100}, "metrics": {"enabled": False}}
# --auth: router_overhead.py's AUTH_POLICY, a caller token and an admin token (the admin registers).
CALLER_TOKEN = "bench-caller-token"
ADMIN_TOKEN = "bench-admin-token"
AUTH = {
    "auth": {
        "tokens": [
            {"role": "caller", "sha256": hashlib.sha256(CALLER_TOKEN.encode()).hexdigest()},
            {"role": "admin", "sha256": hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()},
        ]
    }
}


async def measure(
    agent_url: str, requests: int, connections: int, observability: bool = True, auth: bool = False
) -> Counter:
    from reachmesh.config import RouterConfig
    from reachmesh.observability import logging as reach_logging
    from reachmesh.testing import RouterServer

    with open("/dev/null", "w") as devnull:  # noqa: ASYNC230 - once, before any load
        reach_logging.configure("INFO", stream=devnull)
        # A store of 100 hops is full after the warm-up: each measured call then evicts one, as
        # in a Router that has run a while (the default 10,000 would need that many calls).
        policy: dict[str, Any] = {"registry": {"lease_ttl_seconds": 3600}, "tracing": {"store_size": 100}}
        policy = policy if observability else {**policy, **OFF}
        config = RouterConfig.model_validate({**policy, **AUTH} if auth else policy)
        token = CALLER_TOKEN if auth else None
        counter = Counter()
        async with RouterServer(config) as router:
            await _register(router.url, agent_url, ADMIN_TOKEN if auth else None)
            port = int(router.url.rsplit(":", 1)[1])
            await client(port, 100, 1, token)  # warm-up: connections made, caches filled
            sys.settrace(counter.trace)
            try:
                await client(port, requests, connections, token)
            finally:
                sys.settrace(None)
        return counter


def _profile(agent_url: str) -> dict[str, Any]:
    return {**PROFILE, "network": {"endpoint": agent_url}}


async def _register(router_url: str, agent_url: str, token: str | None) -> None:
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers) as http:
        answer = await http.post(f"{router_url}/agents", json=_profile(agent_url))
        if answer.status_code != 201:
            raise RuntimeError(f"registering the agent failed: {answer.status_code} {answer.text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--top", type=int, default=0, help="also list the N functions that run the most")
    parser.add_argument(
        "--observability", choices=["on", "off"], default="on", help="off: tracing and metrics switched off"
    )
    parser.add_argument("--auth", action="store_true", help="auth on: calls carry a caller token")
    args = parser.parse_args(argv)
    port = free_port()
    agent_url = f"http://127.0.0.1:{port}/reach"
    agent = subprocess.Popen(
        [sys.executable, str(BENCH_DIR / "fast_agent.py"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                if answers_success(agent_url, {"targetTask": "echo", "payload": {}}):
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(0.1)
        counter = uvloop.run(
            measure(agent_url, args.requests, args.connections, args.observability == "on", args.auth)
        )
    finally:
        agent.terminate()
        agent.wait()
    total = sum(counter.counts.values())
    print(
        f"Python bytecodes per /reach call: {total / args.requests:,.0f} "
        f"({args.requests} calls, tracing and metrics {args.observability}{', auth on' if args.auth else ''})"
    )
    for (where, name), count in counter.counts.most_common(args.top):
        print(f"{count / args.requests:9.1f}  {where}:{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
