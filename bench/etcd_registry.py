"""The etcd registry's costs, measured against a real etcd (Debian etcd-server) on loopback.

Four parts, each printed as it finishes:

* overhead:  requests/s at c32 and p50 at c1 through a Router on the in-memory registry and
             one on etcd, same agent, same policy, alternating rounds. Routing reads a local
             snapshot in both, so they should match within noise.
* scale:     register N agents (distinct capabilities, one description each) through Router A,
             which embeds them; then start Router B and time it to /readyz and to every agent
             ready by meaning (B takes the vectors A stored in etcd).
* renewals:  N agents renewing every --renew-every seconds through the Router: the load on etcd
             (requests/s and bytes/s, from etcd's own /metrics).
* workers:   requests/s at c32 through `reach router --workers 2` against `--workers 1`.

Run (after ``scripts/bench-deps`` for wrk, and ``scripts/test-deps`` for etcd)::

    .venv/bin/python bench/etcd_registry.py
    .venv/bin/python bench/etcd_registry.py --agents 1000 --duration 10 --rounds 3
    .venv/bin/python bench/etcd_registry.py --secured     # etcd over TLS with its login on
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import httpx

import wrk_runner
from reachmesh.cli.etcd import EtcdCluster, loopback_tls
from servers import Server, free_port

BENCH_DIR = Path(__file__).resolve().parent
REQUEST = {"targetTask": "echo", "payload": {"n": 1}}
WORDS = [
    "invoice",
    "weather",
    "flight",
    "hotel",
    "refund",
    "parcel",
    "translate",
    "summarize",
    "calendar",
    "meeting",
    "password",
    "ticket",
    "stock",
    "currency",
    "recipe",
    "music",
    "playlist",
    "contract",
    "payroll",
    "inventory",
    "warehouse",
    "shipment",
    "insurance",
    "claim",
    "mortgage",
    "loan",
    "credit",
    "budget",
    "forecast",
    "rainfall",
    "traffic",
    "parking",
    "charging",
    "battery",
    "solar",
    "thermostat",
]


# With --secured: what every Router on etcd gets besides the endpoints (its login, its CA).
SECURED: dict[str, Any] = {"env": {}, "policy": ""}
SECURED_PASSWORD = "bench-etcd-pw-31c7"


def secured_cluster(tmp: Path, name: str) -> EtcdCluster:
    """A member serving TLS only, with authentication on and a user for the Routers' prefix."""
    tls = loopback_tls(tmp, name)
    SECURED["env"] = {"REACH_ETCD_USERNAME": "reach", "REACH_ETCD_PASSWORD": SECURED_PASSWORD}
    SECURED["policy"] = f"  etcd:\n    ca_file: {tls[2]}\n"
    return EtcdCluster(tmp / f"etcd-{name}", 1, tls=tls)


def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def router(
    tmp: Path, name: str, port: int, etcd: str | None, *, embedding: str = "none", workers: int = 1
) -> Server:
    policy = tmp / f"{name}.yaml"
    access = SECURED["policy"] if etcd else ""
    policy.write_text(
        f"registry:\n  lease_ttl_seconds: 3600\n{access}embedding:\n  backend: {embedding}\n"
        "limits:\n  loop_lag_ms: 10000\nlogging:\n  level: WARNING\n"
    )
    argv = [sys.executable, "-m", "reachmesh", "router", "--port", str(port), "--config", str(policy)]
    if workers > 1:
        argv += ["--workers", str(workers)]
    env = {"REACH_ETCD_ENDPOINTS": etcd or "", **(SECURED["env"] if etcd else {})}
    server = Server(name, argv, tmp / f"{name}.log", env)
    server.start()
    wait_ready(f"http://127.0.0.1:{port}", server)
    return server


def wait_ready(url: str, server: Server, limit_s: float = 60) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        server.check_alive()
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"{url} not ready after {limit_s} s")


def register(url: str, agent_url: str, agent_id: str = "bench-agent", task: str = "echo") -> None:
    body = {"id": agent_id, "network": {"endpoint": agent_url}, "capabilities": [{"task": task}]}
    resp = httpx.post(f"{url}/agents", json=body, timeout=10)
    if resp.status_code not in (200, 201):
        raise RuntimeError(f"registration failed: {resp.status_code} {resp.text}")


def wrk_rps(url: str, script: Path, connections: int, duration: float) -> wrk_runner.WrkResult:
    return wrk_runner.run(
        f"{url}/reach", script, connections=connections, threads=1, duration_s=duration, core=None
    )


# -- overhead ---------------------------------------------------------------------------------


def overhead(tmp: Path, cluster: EtcdCluster, agent_url: str, args: argparse.Namespace) -> None:
    script = wrk_runner.write_post_script(tmp / "post.lua", REQUEST)
    ports = {"memory": free_port(), "etcd": free_port()}
    servers = {
        "memory": router(tmp, "router-memory", ports["memory"], None),
        "etcd": router(tmp, "router-etcd", ports["etcd"], cluster.endpoints),
    }
    try:
        for port in ports.values():
            register(f"http://127.0.0.1:{port}", agent_url)
        rps: dict[str, list[float]] = {name: [] for name in ports}
        p50: dict[str, list[float]] = {name: [] for name in ports}
        for round_ in range(args.rounds):
            for name, port in ports.items():
                progress(f"overhead round {round_ + 1}: {name}")
                url = f"http://127.0.0.1:{port}"
                rps[name].append(wrk_rps(url, script, 32, args.duration).rps)
                p50[name].append(wrk_rps(url, script, 1, args.duration / 2).p50_ms)
        print("\noverhead: the same Router on each registry (median of rounds)")
        print(f"  {'registry':<10} {'req/s c32':>10} {'p50 c1 ms':>10}")
        for name in ports:
            print(f"  {name:<10} {statistics.median(rps[name]):>10.0f} {statistics.median(p50[name]):>10.3f}")
        ratio = statistics.median(rps["etcd"]) / statistics.median(rps["memory"])
        print(f"  etcd / memory throughput: {ratio:.2f}")
    finally:
        for server in servers.values():
            server.stop()


# -- scale ------------------------------------------------------------------------------------


def profile(i: int, agent_url: str) -> dict[str, Any]:
    a, b, c = WORDS[i % len(WORDS)], WORDS[(i * 7 + 3) % len(WORDS)], WORDS[(i * 13 + 5) % len(WORDS)]
    return {
        "id": f"agent-{i:05d}",
        "network": {"endpoint": agent_url},
        "capabilities": [
            {"task": f"{a}_{b}_{i}", "description": f"Handles {a} and {b} requests about {c}, case {i}."}
        ],
    }


async def register_many(url: str, agent_url: str, count: int, concurrency: int = 32) -> float:
    queue = list(range(count))
    started = time.monotonic()

    async def worker(http: aiohttp.ClientSession) -> None:
        while queue:
            i = queue.pop()
            async with http.post(f"{url}/agents", json=profile(i, agent_url)) as resp:
                if resp.status != 201:
                    raise RuntimeError(f"agent {i}: {resp.status} {await resp.text()}")

    # aiohttp, not httpx: httpx's pool costs more CPU than the Router at this concurrency.
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return time.monotonic() - started


def vectors_ready(url: str) -> int:
    rows = httpx.get(f"{url}/admin/agents", timeout=30).json()
    return sum(1 for row in rows if row.get("vectors") == "ready")


def wait_vectors(url: str, count: int, limit_s: float = 600) -> float:
    started = time.monotonic()
    while vectors_ready(url) < count:
        if time.monotonic() - started > limit_s:
            raise RuntimeError(f"{url}: vectors not ready after {limit_s} s")
        time.sleep(0.1)
    return time.monotonic() - started


def scale(tmp: Path, cluster: EtcdCluster, agent_url: str, args: argparse.Namespace) -> None:
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    a = router(tmp, "router-a", port_a, cluster.endpoints, embedding="local")
    try:
        progress(f"registering {args.agents} agents through Router A")
        took = asyncio.run(register_many(url_a, agent_url, args.agents))
        print(f"\nscale: {args.agents} agents, one capability and description each")
        print(f"  registered through one Router: {took:.2f} s ({args.agents / took:.0f}/s)")
        progress("waiting for Router A to embed them")
        print(f"  Router A had embedded them all {wait_vectors(url_a, args.agents):.1f} s later")
        # Router A's last vectors reach etcd a moment after it marks them ready.
        time.sleep(1)
        started = time.monotonic()
        b = router(tmp, "router-b", port_b, cluster.endpoints, embedding="local")
        try:
            ready = time.monotonic() - started
            wait_vectors(url_b, args.agents, limit_s=120)
            by_meaning = time.monotonic() - started
            listed = len(httpx.get(f"{url_b}/admin/agents", timeout=30).json())
            print(f"  a new Router B: /readyz 200 after {ready:.2f} s with {listed} agents listed")
            print(f"  ... and every agent ready by meaning after {by_meaning:.2f} s (vectors from etcd)")
        finally:
            b.stop()
    finally:
        a.stop()


# -- renewals ---------------------------------------------------------------------------------

_METRIC = re.compile(r"^(\w+)(\{[^}]*\})? ([0-9.e+-]+)$", re.M)


def etcd_counters(cluster: EtcdCluster) -> dict[str, float]:
    member = cluster.members[0]
    text = httpx.get(member.client_url + "/metrics", timeout=5, verify=member.verify_context()).text
    totals: dict[str, float] = {"requests": 0.0, "received": 0.0, "sent": 0.0}
    for name, _labels, value in _METRIC.findall(text):
        if name == "grpc_server_handled_total":
            totals["requests"] += float(value)
        elif name == "etcd_network_client_grpc_received_bytes_total":
            totals["received"] += float(value)
        elif name == "etcd_network_client_grpc_sent_bytes_total":
            totals["sent"] += float(value)
    return totals


async def renew_all(url: str, leases: dict[str, str], period: float) -> None:
    """Renew every lease once per ``period``, spread evenly, as N independent agents would."""
    gap = period / len(leases)
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:

        async def renew(agent_id: str, lease: str) -> int:
            async with http.put(f"{url}/agents/{agent_id}/lease", json={"leaseId": lease}) as resp:
                return resp.status

        pending = []
        for n, (agent_id, lease) in enumerate(leases.items()):
            await asyncio.sleep(max(0.0, started + n * gap - time.monotonic()))
            pending.append(asyncio.ensure_future(renew(agent_id, lease)))
        answers = await asyncio.gather(*pending)
    bad = [status for status in answers if status != 200]
    if bad:
        raise RuntimeError(f"{len(bad)} renewals failed: {bad[:5]}")


def renewals(tmp: Path, cluster: EtcdCluster, agent_url: str, args: argparse.Namespace) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = router(tmp, "router-renew", port, cluster.endpoints)
    try:
        leases = {}
        with httpx.Client(timeout=30) as http:
            for i in range(args.agents):
                body = profile(i + 100_000, agent_url)
                leases[body["id"]] = http.post(f"{url}/agents", json=body).json()["leaseId"]
        progress(f"{args.agents} agents renewing every {args.renew_every:g} s")
        before = etcd_counters(cluster)
        started = time.monotonic()
        asyncio.run(renew_all(url, leases, args.renew_every))
        seconds = time.monotonic() - started
        after = etcd_counters(cluster)
        print(f"\nrenewals: {args.agents} agents, each renewing every {args.renew_every:g} s, one Router")
        print(f"  etcd load: {(after['requests'] - before['requests']) / seconds:.1f} requests/s,")
        print(
            f"  {(after['received'] - before['received']) / seconds / 1024:.1f} KiB/s in, "
            f"{(after['sent'] - before['sent']) / seconds / 1024:.1f} KiB/s out"
        )
    finally:
        server.stop()


# -- workers ----------------------------------------------------------------------------------


def workers(tmp: Path, cluster: EtcdCluster, agent_url: str, args: argparse.Namespace) -> None:
    script = wrk_runner.write_post_script(tmp / "post-w.lua", REQUEST)
    results: dict[int, list[float]] = {1: [], 2: []}
    for round_ in range(args.rounds):
        for count in (1, 2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            progress(f"workers round {round_ + 1}: --workers {count}")
            server = router(tmp, f"router-w{count}", port, cluster.endpoints, workers=count)
            try:
                register(url, agent_url, agent_id=f"bench-w{count}-{round_}", task="echo")
                time.sleep(0.5)  # every worker's snapshot has the agent (the watch is sub-ms here)
                results[count].append(wrk_rps(url, script, 32, args.duration).rps)
            finally:
                server.stop()
    one, two = statistics.median(results[1]), statistics.median(results[2])
    print("\nworkers: one port, c32 (wrk, the agent and the Routers share the machine's cores)")
    print(f"  --workers 1: {one:.0f} req/s   --workers 2: {two:.0f} req/s   ratio {two / one:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--renew-every", type=float, default=20.0)
    parser.add_argument("--parts", default="overhead,scale,renewals,workers")
    parser.add_argument(
        "--secured", action="store_true", help="etcd serving TLS only, with its authentication on"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="reach-bench-etcd-") as raw:
        tmp = Path(raw)
        agent_port = free_port()
        agent = Server(
            "agent", [sys.executable, str(BENCH_DIR / "fast_agent.py"), str(agent_port)], tmp / "agent.log"
        )
        agent.start()
        agent_url = f"http://127.0.0.1:{agent_port}/reach"
        try:
            parts = {"overhead": overhead, "scale": scale, "renewals": renewals, "workers": workers}
            for name in args.parts.split(","):
                cluster = secured_cluster(tmp, name) if args.secured else EtcdCluster(tmp / f"etcd-{name}", 1)
                with cluster:
                    if args.secured:
                        prefix = "/agent-reach/v1/"
                        cluster.secure("bench-root-pw", {"reach": (SECURED_PASSWORD, prefix, "READWRITE")})
                    parts[name](tmp, cluster, agent_url, args)
        finally:
            agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
