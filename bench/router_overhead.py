"""What the Router costs per request, against the same fast agent, in one run.

Four paths are driven by wrk against one agent process (bench/fast_agent.py):

* direct:      wrk -> agent
* baseline:    wrk -> bench/passthrough_proxy.py -> agent   (the floor for a Python forwarder)
* router:      wrk -> Agent-Reach Router -> agent            (every default feature on, INFO logs)
* router-bare: wrk -> a second Router -> agent               (the same, but ``tracing`` and
  ``metrics`` switched off in its policy file; INFO logs too)

For each it reports requests/s at c32, p50/p99 latency at c1 and c32, and the forwarder's CPU
time per request; then the Router's RSS across a long run, and PASS/MISS against the targets:

* router req/s at c32 / baseline req/s at c32 >= 1.2
* added p50 at c1 (router - direct) <= 0.15 ms, and no more than the baseline adds
* p99 at c32 no higher than the baseline's
* tracing+metrics overhead: router req/s at c32 / router-bare req/s at c32 >= 0.95
* the Router's RSS flat (within --memory-tolerance-mib) across --memory-requests requests

Both Routers and the proxy share one core (only one of them is loaded at a time); with
``--rounds N`` the paths are measured in turn N times and each figure is the median. Each round
starts the proxy and the Routers as new processes (``--same-processes`` keeps the first ones),
because two processes of one configuration can differ by more than tracing and metrics cost;
odd rounds measure them in reverse order. The report gives each round's c32 ratios too.

Run (after ``scripts/bench-deps``, which installs wrk)::

    .venv/bin/python bench/router_overhead.py
    .venv/bin/python bench/router_overhead.py --duration 10 --json bench-results.json

The Router is started as ``python -m reachmesh``, so PYTHONPATH picks its code; to measure the
committed Router while src/ is being edited::

    git archive HEAD src | tar -x -C /tmp/reach-head
    PYTHONPATH=/tmp/reach-head/src .venv/bin/python bench/router_overhead.py

Other processes on the machine (a test suite, say) disturb the figures; the "other CPU" column
shows how much CPU they took during each path's runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import wrk_runner
from servers import CpuSnapshot, Server, answers_success, free_port, http, pinned
from wrk_runner import WrkResult

BENCH_DIR = Path(__file__).resolve().parent
SETUP_TIMEOUT_S = 15.0
AGENT_ID = "bench-agent"
REQUEST = {"targetTask": "echo", "payload": {"n": 1}}
PROFILE_CAPABILITIES = [{"task": "echo", "input_schema": {"n": "integer"}}]
# Long enough that no lease renewal happens during the run: renewal is not what is measured.
LEASE_TTL_S = 3600
MIB = 1024 * 1024

# Targets the Router is held to (issue #39): with every default on, more requests at c32 than
# the minimal proxy, little added at c1 and never more than the proxy adds, and a tail at c32 no
# longer than the proxy's.
MIN_THROUGHPUT_RATIO = 1.2
MAX_ADDED_P50_MS = 0.15
# router req/s over router-bare req/s at c32: what tracing and metrics may cost together.
MIN_TRACING_METRICS_RATIO = 0.95
# The policy that switches them off, on top of the one both Routers share.
BARE_POLICY = "tracing:\n  enabled: false\nmetrics:\n  enabled: false\n"
# router-auth req/s over router req/s at c32: what checking a bearer token on every call costs.
MIN_AUTH_RATIO = 0.95
# Every path is sent the caller's token (the others ignore it); router-auth checks it.
CALLER_TOKEN = "bench-caller-token-5f2b"
ADMIN_TOKEN = "bench-admin-token-9c1d"
AUTH_POLICY = (
    "auth:\n  tokens:\n"
    f"  - {{role: caller, sha256: {hashlib.sha256(CALLER_TOKEN.encode()).hexdigest()}}}\n"
    f"  - {{role: admin, sha256: {hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()}}}\n"
)
# Above this share of a core used by strangers during a run, the figures are flagged as noisy.
NOISE_WARNING = 0.05


@dataclass
class PathResult:
    name: str
    url: str
    c1: WrkResult | None = None
    c32: WrkResult | None = None
    forwarder_cpu_us: float | None = None  # per request, c32 run; None for direct
    agent_cpu_us: float | None = None  # per request, c32 run
    # Mean share of one core taken by processes the bench did not start, during each run.
    foreign_core_c1: float = 0.0
    foreign_core_c32: float = 0.0

    @property
    def errors(self) -> int:
        return sum(run.errors for run in (self.c1, self.c32) if run is not None)

    @property
    def socket_errors(self) -> int:
        return sum(run.socket_errors for run in (self.c1, self.c32) if run is not None)

    @property
    def statuses(self) -> dict[int, int]:
        return merge_statuses(run.statuses for run in (self.c1, self.c32) if run is not None)

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "c1": self.c1.to_json() if self.c1 else None,
            "c32": self.c32.to_json() if self.c32 else None,
            "forwarder_cpu_us_per_request": self.forwarder_cpu_us,
            "agent_cpu_us_per_request": self.agent_cpu_us,
            "failed_requests": self.errors,
            "failed_by_status": self.statuses,
            "foreign_cpu_core_share": {"c1": self.foreign_core_c1, "c32": self.foreign_core_c32},
        }


@dataclass
class MemoryResult:
    target_requests: int
    requests: int = 0
    rss_before: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list)  # (requests so far, RSS bytes)
    errors: int = 0
    socket_errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def rss_after(self) -> int:
        return self.samples[-1][1] if self.samples else self.rss_before

    @property
    def growth(self) -> int:
        return self.rss_after - self.rss_before

    def to_json(self) -> dict[str, Any]:
        return {
            "target_requests": self.target_requests,
            "requests": self.requests,
            "rss_before_bytes": self.rss_before,
            "rss_after_bytes": self.rss_after,
            "rss_growth_bytes": self.growth,
            "samples": [{"requests": n, "rss_bytes": rss} for n, rss in self.samples],
            "errors": self.errors,
            "statuses": self.statuses,
        }


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measured run (default 5)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure all paths this many times; report medians"
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up before each run")
    parser.add_argument("--connections", type=int, default=32, help="connections of the loaded run")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads of the loaded run")
    parser.add_argument("--server-core", type=int, default=0, help="core for the Routers and the proxy")
    parser.add_argument("--agent-core", type=int, default=1, help="core for the agent")
    parser.add_argument("--wrk-core", type=int, default=1, help="core for wrk")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes with taskset")
    parser.add_argument(
        "--memory-requests", type=int, default=100_000, help="requests of the Router RSS run (0: skip)"
    )
    parser.add_argument("--memory-chunks", type=int, default=5, help="RSS samples across that run")
    parser.add_argument(
        "--memory-tolerance-mib", type=float, default=2.0, help="RSS growth still counted as flat"
    )
    parser.add_argument(
        "--router-log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="diagnosis only: run both Routers at another log level than their default (INFO)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument(
        "--compare-src",
        help="a src/ folder of another version: its Router is measured too, as router-other",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the work dir with the server logs")
    parser.add_argument(
        "--same-processes",
        action="store_true",
        help="keep one process per forwarder across rounds (default: each round starts them afresh)",
    )
    return parser.parse_args(argv)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir = Path(tempfile.mkdtemp(prefix="reach-bench-"))
        self.script = wrk_runner.write_post_script(
            self.workdir / "post.lua", REQUEST, {"Authorization": f"Bearer {CALLER_TOKEN}"}
        )
        self.started: list[Server] = []
        self.sent: dict[str, int] = {}  # requests wrk completed per URL, warm-ups included
        self.source = router_source()
        pin = not args.no_pin
        self.server_core = args.server_core if pin else None
        self.agent_core = args.agent_core if pin else None
        self.wrk_core = args.wrk_core if pin else None

    # -- processes ---------------------------------------------------------------------------

    def _start(self, server: Server) -> Server:
        self.started.append(server)
        server.start()
        return server

    def start_agent(self) -> tuple[Server, str]:
        port = free_port()
        url = f"http://127.0.0.1:{port}/reach"
        argv = pinned(self.agent_core, [sys.executable, str(BENCH_DIR / "fast_agent.py"), str(port)])
        agent = self._start(Server("agent", argv, self.workdir / "agent.log"))
        agent.wait_ready(lambda: answers_success(url, REQUEST))
        return agent, url

    def start_proxy(self, agent_url: str, tag: str = "") -> tuple[Server, str]:
        port = free_port()
        url = f"http://127.0.0.1:{port}/reach"
        argv = pinned(self.server_core, [sys.executable, str(BENCH_DIR / "passthrough_proxy.py"), str(port)])
        proxy = self._start(
            Server(
                "baseline proxy", argv, self.workdir / f"proxy{tag}.log", env={"BENCH_AGENT_URL": agent_url}
            )
        )
        proxy.wait_ready(lambda: answers_success(url, REQUEST))
        return proxy, url

    def start_router(
        self, agent_url: str, name: str = "router", policy: str = "", src: str | None = None, tag: str = ""
    ) -> tuple[Server, str]:
        """A Router with the shared policy plus ``policy``, and the agent registered with it."""
        config = self.workdir / f"{name}{tag}.yaml"
        config.write_text(f"registry:\n  lease_ttl_seconds: {LEASE_TTL_S}\n{policy}")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        argv = pinned(
            self.server_core,
            [sys.executable, "-m", "reachmesh", "router", "--port", str(port), "--config", str(config)],
        )
        # The trace lines are a default feature, so the default level (INFO) is what is measured;
        # another level only shows what logging costs.
        if self.args.router_log_level:
            argv += ["--log-level", self.args.router_log_level]
        env = {"PYTHONPATH": src} if src else None
        router = self._start(Server(name, argv, self.workdir / f"{name}{tag}.log", env=env))
        router.wait_ready(lambda: http("GET", f"{base}/healthz")[0] == 200)
        profile = {
            "id": AGENT_ID,
            "network": {"endpoint": agent_url},
            "capabilities": PROFILE_CAPABILITIES,
        }
        # A Router's first calls import and build what later calls reuse: on a busy machine
        # (a test suite beside the bench) they can take seconds.
        status, answer = http(
            "POST", f"{base}/agents", profile, timeout_s=SETUP_TIMEOUT_S, headers=_bearer(ADMIN_TOKEN)
        )
        if status != 201:
            raise RuntimeError(f"registering {AGENT_ID} failed: HTTP {status} {answer}")
        if not answers_success(
            f"{base}/reach", REQUEST, headers=_bearer(CALLER_TOKEN), timeout_s=SETUP_TIMEOUT_S
        ):
            raise RuntimeError(f"{name} does not answer SUCCESS; see {router.log_path}")
        return router, f"{base}/reach"

    def stop_all(self) -> None:
        for server in reversed(self.started):
            try:
                server.stop()
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                # Keep stopping the others whatever one of them does.
                print(f"warning: stopping {server.name}: {exc}", file=sys.stderr)

    # -- measuring ---------------------------------------------------------------------------

    def wrk(self, url: str, connections: int, threads: int, duration_s: float) -> WrkResult:
        result = wrk_runner.run(
            url,
            self.script,
            connections=connections,
            threads=threads,
            duration_s=duration_s,
            core=self.wrk_core,
        )
        self.sent[url] = self.sent.get(url, 0) + result.requests
        return result

    def measure(self, path: PathResult, forwarder: Server | None, agent: Server) -> None:
        args = self.args
        progress(f"{path.name}: c1")
        self.wrk(path.url, 1, 1, args.warmup)
        path.c1, spent = self.bracketed(path.url, 1, 1)
        path.foreign_core_c1 = spent["foreign_core"]
        progress(f"{path.name}: c{args.connections}")
        self.wrk(path.url, args.connections, args.wrk_threads, args.warmup)
        path.c32, spent = self.bracketed(path.url, args.connections, args.wrk_threads)
        path.foreign_core_c32 = spent["foreign_core"]
        path.agent_cpu_us = spent[agent.name] / path.c32.requests * 1e6
        if forwarder is not None:
            path.forwarder_cpu_us = spent[forwarder.name] / path.c32.requests * 1e6
        for server in self.started:
            server.check_alive()

    def bracketed(self, url: str, connections: int, threads: int) -> tuple[WrkResult, dict[str, float]]:
        """One measured run, with the CPU each process (and everyone else) used during it."""
        before = CpuSnapshot.take(self.started)
        result = self.wrk(url, connections, threads, self.args.duration)
        return result, before.until(CpuSnapshot.take(self.started))

    def memory(self, router: Server, url: str, rps: float) -> MemoryResult:
        """RSS across ``--memory-requests`` requests at full load, sampled ``--memory-chunks`` times.

        wrk stops on time, not on a count, so each chunk's duration comes from the measured
        throughput, and chunks go on until the count is reached.
        """
        args = self.args
        result = MemoryResult(args.memory_requests)
        # Taken after the measured runs, so start-up allocations and fixed-size buffers (the
        # Router's ring of recent traces, say) have filled: whatever still grows is a leak. With
        # a very short --duration they may not have filled yet, and the run shows that growth.
        result.rss_before = router.rss_bytes()
        chunk = math.ceil(args.memory_requests / max(1, args.memory_chunks))
        while result.requests < args.memory_requests:
            wanted = min(chunk, args.memory_requests - result.requests)
            seconds = max(1, math.ceil(wanted / rps))
            progress(f"router RSS run: {result.requests:,}/{args.memory_requests:,} requests")
            run = self.wrk(url, args.connections, args.wrk_threads, seconds)
            result.requests += run.requests
            result.errors += run.errors
            result.socket_errors += run.socket_errors
            result.statuses = merge_statuses([result.statuses, run.statuses])
            router.check_alive()
            result.samples.append((result.requests, router.rss_bytes()))
        return result

    def start_forwarders(self, agent_url: str, tag: str) -> tuple[dict[str, Server | None], dict[str, str]]:
        """The proxy and every Router, each a new process; ``tag`` names this round's log files."""
        proxy, proxy_url = self.start_proxy(agent_url, tag)
        router, router_url = self.start_router(agent_url, tag=tag)
        bare, bare_url = self.start_router(agent_url, "router-bare", BARE_POLICY, tag=tag)
        auth, auth_url = self.start_router(agent_url, "router-auth", AUTH_POLICY, tag=tag)
        forwarders: dict[str, Server | None] = {
            "baseline": proxy,
            "router": router,
            "router-bare": bare,
            "router-auth": auth,
        }
        urls = {"baseline": proxy_url, "router": router_url, "router-bare": bare_url, "router-auth": auth_url}
        compare = self.args.compare_src
        if compare:
            # Another checkout's Router (e.g. `git archive OLD src`), measured in the same rounds.
            forwarders["router-other"], urls["router-other"] = self.start_router(
                agent_url, "router-other", "", src=compare, tag=tag
            )
        return forwarders, urls

    def stop_forwarders(self, forwarders: dict[str, Server | None]) -> None:
        for server in forwarders.values():
            if server is not None:
                server.stop()
                self.started.remove(server)

    def run(self) -> dict[str, Any]:
        agent, agent_url = self.start_agent()
        forwarders: dict[str, Server | None] = {}
        logged: dict[str, list[tuple[Path, str]]] = {"router": [], "router-bare": []}
        # Rounds interleave the paths, so a burst of outside load hits one round of each, not
        # every run of one path; the median of each figure then drops it. Two processes of one
        # configuration differ by up to a tenth in CPU per request here (hash seed, heap
        # layout), more than the cost of tracing and metrics, so each round starts every
        # forwarder afresh (unless --same-processes) and the medians are over processes too.
        # Odd rounds take the forwarders in reverse order, so a drift in outside load over a
        # round does not always favour the same path.
        self.rounds: list[dict[str, PathResult]] = []
        for number in range(self.args.rounds):
            if self.args.rounds > 1:
                progress(f"round {number + 1}/{self.args.rounds}")
            if number == 0 or not self.args.same_processes:
                self.stop_forwarders(forwarders)
                forwarders, urls = self.start_forwarders(agent_url, f"-r{number + 1}" if number else "")
                for name, entries in logged.items():
                    server = forwarders[name]
                    assert server is not None
                    entries.append((server.log_path, urls[name]))
            order = list(urls) if number % 2 == 0 else list(reversed(urls))
            paths = {"direct": PathResult("direct", agent_url)}
            paths.update({name: PathResult(name, urls[name]) for name in order})
            for name, path in paths.items():
                self.measure(path, forwarders.get(name), agent)
            self.rounds.append(paths)
        router, router_url = forwarders["router"], urls["router"]
        assert router is not None
        urls = {"direct": agent_url, **urls}
        results = {name: median_path([r[name] for r in self.rounds]) for name in urls}
        memory = None
        if self.args.memory_requests > 0:
            rps = results["router"].c32.rps if results["router"].c32 else 1000.0
            memory = self.memory(router, router_url, rps)
        logs = {
            name: RouterLog.read(
                [path for path, _ in entries], sum(self.sent.get(url, 0) for _, url in entries)
            )
            for name, entries in logged.items()
        }
        return self.report(results, memory, logs)

    # -- output ------------------------------------------------------------------------------

    def per_round(self) -> list[str]:
        """Each round's own c32 ratios: their spread says how far one run's medians can be trusted."""
        if len(self.rounds) < 2:
            return []

        def ratios(top: str, bottom: str) -> str:
            shown = []
            for paths in self.rounds:
                a, b = paths[top].c32, paths[bottom].c32
                shown.append(f"{a.rps / b.rps:.2f}" if a and b else "-")
            return " ".join(shown)

        c = self.args.connections
        return [
            f"per round at c{c}:              router / baseline {ratios('router', 'baseline')}; "
            f"router / router-bare {ratios('router', 'router-bare')}",
        ]

    def log_level(self) -> str:
        level = self.args.router_log_level
        if level is None or level == "INFO":
            return "INFO level (default)"
        return f"{level} level: NOT the default, so this run does not measure the default Router"

    def layout(self) -> dict[str, Any]:
        if self.args.no_pin:
            return {"pinned": False}
        return {
            "pinned": True,
            "router_and_proxy_core": self.server_core,  # both Routers
            "agent_core": self.agent_core,
            "wrk_core": self.wrk_core,
        }

    def report(
        self,
        results: dict[str, PathResult],
        memory: MemoryResult | None,
        logs: dict[str, RouterLog],
    ) -> dict[str, Any]:
        args = self.args
        direct, baseline, router = results["direct"], results["baseline"], results["router"]
        bare, auth = results["router-bare"], results["router-auth"]
        assert direct.c1 and direct.c32 and baseline.c1 and baseline.c32 and router.c1 and router.c32
        assert bare.c1 and bare.c32 and auth.c32
        auth_ratio = auth.c32.rps / router.c32.rps
        ratio = router.c32.rps / baseline.c32.rps
        observability_ratio = router.c32.rps / bare.c32.rps
        added_router = router.c1.p50_ms - direct.c1.p50_ms
        added_bare = bare.c1.p50_ms - direct.c1.p50_ms
        added_baseline = baseline.c1.p50_ms - direct.c1.p50_ms
        # A failed answer can be a fast one (a 429 costs little): figures with failures in them
        # cannot pass a speed target.
        targets: dict[str, dict[str, Any]] = {
            "throughput_ratio_c32": {
                "value": round(ratio, 3),
                "target": f">= {MIN_THROUGHPUT_RATIO}",
                "pass": ratio >= MIN_THROUGHPUT_RATIO and router.c32.errors == 0,
                "failed_requests": router.c32.errors,
            },
            "added_p50_c1_ms": {
                "value": round(added_router, 3),
                "target": f"<= {MAX_ADDED_P50_MS} and <= the baseline's ({added_baseline:.3f})",
                "pass": added_router <= MAX_ADDED_P50_MS
                and added_router <= added_baseline
                and router.c1.errors == 0,
                "failed_requests": router.c1.errors,
            },
            "p99_c32_ms": {
                "value": router.c32.p99_ms,
                "target": f"<= the baseline's ({baseline.c32.p99_ms})",
                "pass": router.c32.p99_ms <= baseline.c32.p99_ms and router.c32.errors == 0,
                "failed_requests": router.c32.errors,
            },
            "tracing_metrics_ratio_c32": {
                "value": round(observability_ratio, 3),
                "target": f">= {MIN_TRACING_METRICS_RATIO}",
                "pass": observability_ratio >= MIN_TRACING_METRICS_RATIO
                and router.c32.errors == 0
                and bare.c32.errors == 0,
                "failed_requests": router.c32.errors + bare.c32.errors,
            },
            "auth_ratio_c32": {
                "value": round(auth_ratio, 3),
                "target": f">= {MIN_AUTH_RATIO}",
                "pass": auth_ratio >= MIN_AUTH_RATIO and auth.c32.errors == 0,
                "failed_requests": auth.c32.errors,
            },
        }
        if memory is not None:
            targets["rss_growth_mib"] = {
                "value": round(memory.growth / MIB, 2),
                "target": f"<= {args.memory_tolerance_mib:g} over {memory.requests} requests",
                "pass": memory.growth <= args.memory_tolerance_mib * MIB,
            }

        c = args.connections
        kept = "" if args.keep_logs else "; deleted at exit, --keep-logs keeps it"
        lines = [
            "",
            "Agent-Reach Router overhead",
            f"  wrk {wrk_version()}: {args.duration:g} s per run after {args.warmup:g} s warm-up; "
            f"c1 = -t1 -c1, c{c} = -t{args.wrk_threads} -c{c}; body {json.dumps(REQUEST)}",
            f"  figures: {'median of ' + str(args.rounds) + ' rounds' if args.rounds > 1 else 'one round'}"
            " (--rounds N for medians)",
            "  layout: "
            + (
                f"router / router-bare / proxy on core {self.server_core}, agent on core {self.agent_core}, "
                f"wrk on core {self.wrk_core} (taskset); all on 127.0.0.1"
                if not args.no_pin
                else "not pinned; all on 127.0.0.1"
            ),
            f"  Router code: {self.source}",
            f"  Router logs: {self.log_level()}; stderr to files{kept}:",
            *(
                f"    {name:<11} {log.path} ({log.lines:,} lines, {log.per_request:.1f} per request)"
                for name, log in logs.items()
            ),
            "  router-bare policy: the router's plus tracing: {enabled: false}, metrics: {enabled: false}",
            "",
            f"{'path':<11} {f'req/s c{c}':>11} {'p50 c1':>9} {'p99 c1':>9} {f'p50 c{c}':>9} {f'p99 c{c}':>9}"
            f" {'fwd CPU/req':>12} {'agent CPU/req':>14} {'other CPU':>10} {'failed':>7}",
        ]
        for path in (
            direct,
            baseline,
            router,
            bare,
            auth,
            *([results["router-other"]] if "router-other" in results else []),
        ):
            assert path.c1 and path.c32
            fwd = "-" if path.forwarder_cpu_us is None else f"{path.forwarder_cpu_us:.0f} µs"
            agent_cpu = "-" if path.agent_cpu_us is None else f"{path.agent_cpu_us:.0f} µs"
            other = f"{max(path.foreign_core_c1, path.foreign_core_c32) * 100:.0f}%"
            lines.append(
                f"{path.name:<11} {path.c32.rps:>11,.0f} {ms(path.c1.p50_ms):>9} {ms(path.c1.p99_ms):>9}"
                f" {ms(path.c32.p50_ms):>9} {ms(path.c32.p99_ms):>9} {fwd:>12} {agent_cpu:>14} {other:>10}"
                f" {path.errors:>7}"
            )
        lines.append(
            "  fwd = the Router or proxy process; CPU/req = user+system CPU over the c32 run / requests;"
            " other CPU = share of a core used by processes the bench did not start (max of the runs);"
            " failed = non-2xx answers and socket errors in the measured runs"
        )
        for path in (direct, baseline, router, bare, auth):
            if path.errors:
                detail = describe_errors(path.errors, path.statuses, path.socket_errors)
                lines.append(f"  FAILED requests on {path.name}: {detail}")
        noisiest = max(max(p.foreign_core_c1, p.foreign_core_c32) for p in results.values())
        if noisiest > NOISE_WARNING:
            lines.append(
                f"  WARNING: other processes took up to {noisiest * 100:.0f}% of a core during a run; "
                "the figures may be disturbed: rerun on a quiet machine"
            )
        assert router.forwarder_cpu_us is not None and baseline.forwarder_cpu_us is not None
        assert bare.forwarder_cpu_us is not None
        lines += [
            "",
            f"Router CPU per request (c{c}):   {router.forwarder_cpu_us:.0f} µs "
            f"(baseline proxy {baseline.forwarder_cpu_us:.0f} µs; "
            f"Router extra {router.forwarder_cpu_us - baseline.forwarder_cpu_us:.0f} µs, "
            f"x{router.forwarder_cpu_us / baseline.forwarder_cpu_us:.2f})",
            f"router-bare CPU per request:    {bare.forwarder_cpu_us:.0f} µs "
            f"(tracing+metrics cost {router.forwarder_cpu_us - bare.forwarder_cpu_us:+.0f} µs per request)",
            f"added p50 at c1 over direct:    router {added_router:+.3f} ms, "
            f"router-bare {added_bare:+.3f} ms, baseline {added_baseline:+.3f} ms",
            *self.per_round(),
            "",
            "Targets",
            f"  Router/baseline req/s at c{c}: {ratio:.2f}  (target >= {MIN_THROUGHPUT_RATIO})"
            f"  {verdict(targets['throughput_ratio_c32'])}",
            f"  added p50 at c1 (router - direct): {added_router:.3f} ms  (target <= {MAX_ADDED_P50_MS} ms"
            f" and <= the baseline's {added_baseline:.3f} ms)  {verdict(targets['added_p50_c1_ms'])}",
            f"  p99 at c{c}: router {router.c32.p99_ms:.2f} ms  (target <= the baseline's "
            f"{baseline.c32.p99_ms:.2f} ms)  {verdict(targets['p99_c32_ms'])}",
            f"  tracing+metrics overhead: router req/s at c{c} / router-bare req/s at c{c} = "
            f"{observability_ratio:.2f} (target >= {MIN_TRACING_METRICS_RATIO:.2f})"
            f"  {verdict(targets['tracing_metrics_ratio_c32'])}",
            f"  auth on: router-auth req/s at c{c} / router req/s at c{c} = {auth_ratio:.2f}"
            f" (target >= {MIN_AUTH_RATIO:.2f})  {verdict(targets['auth_ratio_c32'])}",
        ]
        compared = results.get("router-other")
        if compared is not None and compared.c32 is not None:
            lines.append(
                f"  router-other ({self.args.compare_src}): {compared.c32.rps:,.0f} req/s at c{c}, "
                f"{compared.c32.rps / baseline.c32.rps:.2f} x baseline; this Router {ratio:.2f} x; "
                f"this / other = {router.c32.rps / compared.c32.rps:.2f}"
            )
        if memory is not None:
            per_request = memory.growth / max(1, memory.requests)
            lines.append(
                f"  Router RSS over {memory.requests:,} requests at c{c}: "
                f"{memory.rss_before / MIB:.1f} MiB -> {memory.rss_after / MIB:.1f} MiB "
                f"({memory.growth / MIB:+.2f} MiB, {per_request:+.1f} B/request; "
                f"flat = within {args.memory_tolerance_mib:g} MiB)  "
                f"{verdict(targets['rss_growth_mib'])}"
            )
            if memory.errors:
                detail = describe_errors(memory.errors, memory.statuses, memory.socket_errors)
                lines.append(f"    FAILED requests during the RSS run: {detail}")
            samples = (f"{n / 1000:.0f}k: {rss / MIB:.1f} MiB" for n, rss in memory.samples)
            lines.append("    samples: " + ", ".join(samples))
        print("\n".join(lines))
        return {
            "settings": {
                "duration_s": args.duration,
                "rounds": args.rounds,
                "warmup_s": args.warmup,
                "connections": c,
                "wrk_threads": args.wrk_threads,
                "request": REQUEST,
                "wrk": wrk_version(),
                "router_log": {
                    "level": self.args.router_log_level or "INFO",
                    **logs["router"].to_json(),
                },
                "router_bare_log": {
                    "level": self.args.router_log_level or "INFO",
                    **logs["router-bare"].to_json(),
                },
                "router_bare_policy": BARE_POLICY,
                "router_source": self.source,
            },
            "layout": self.layout(),
            "paths": {name: path.to_json() for name, path in results.items()},
            "rounds": [{name: path.to_json() for name, path in r.items()} for r in self.rounds],
            "router_cpu_us_per_request": router.forwarder_cpu_us,
            "router_bare_cpu_us_per_request": bare.forwarder_cpu_us,
            "baseline_cpu_us_per_request": baseline.forwarder_cpu_us,
            "added_p50_c1_ms": {
                "router": added_router,
                "router-bare": added_bare,
                "baseline": added_baseline,
            },
            "memory": memory.to_json() if memory else None,
            "targets": targets,
        }


@dataclass
class RouterLog:
    """How much one Router logged over the whole bench."""

    path: Path
    lines: int
    per_request: float

    @classmethod
    def read(cls, paths: list[Path], requests: int) -> RouterLog:
        """The lines of one configuration's log files (one per process), against its requests."""
        lines = 0
        for path in paths:
            with path.open("rb") as fh:
                lines += sum(1 for _ in fh)
        # The readiness probes add a request or two; against 100k+ that is lost in the rounding.
        return cls(paths[0], lines, lines / max(1, requests))

    def to_json(self) -> dict[str, Any]:
        return {"file": str(self.path), "lines": self.lines, "lines_per_request": round(self.per_request, 2)}


def merge_statuses(parts: Iterable[dict[int, int]]) -> dict[int, int]:
    total: dict[int, int] = {}
    for part in parts:
        for code, n in part.items():
            total[code] = total.get(code, 0) + n
    return dict(sorted(total.items()))


def describe_errors(errors: int, statuses: dict[int, int], socket_errors: int) -> str:
    if not errors:
        return "none"
    parts = [f"HTTP {code} x{n}" for code, n in statuses.items()]
    if socket_errors:
        parts.append(f"socket errors x{socket_errors}")
    return f"{errors} ({', '.join(parts)})"


def median_path(rounds: list[PathResult]) -> PathResult:
    """Each figure's median over the rounds (outside load: the worst round's)."""
    first = rounds[0]

    def wrk_median(runs: list[WrkResult | None]) -> WrkResult:
        done = [r for r in runs if r is not None]
        figures = ("seconds", "rps", "p50_ms", "p75_ms", "p90_ms", "p99_ms")
        fields: dict[str, Any] = {f: statistics.median(getattr(r, f) for r in done) for f in figures}
        fields["requests"] = int(statistics.median(r.requests for r in done))
        # Failures are not averaged away: every one of them, in any round, is reported.
        fields["non_2xx"] = sum(r.non_2xx for r in done)
        fields["socket_errors"] = sum(r.socket_errors for r in done)
        fields["statuses"] = merge_statuses(r.statuses for r in done)
        return WrkResult(**fields)

    def cpu_median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    return PathResult(
        first.name,
        first.url,
        c1=wrk_median([r.c1 for r in rounds]),
        c32=wrk_median([r.c32 for r in rounds]),
        forwarder_cpu_us=cpu_median([r.forwarder_cpu_us for r in rounds]),
        agent_cpu_us=cpu_median([r.agent_cpu_us for r in rounds]),
        foreign_core_c1=max(r.foreign_core_c1 for r in rounds),
        foreign_core_c32=max(r.foreign_core_c32 for r in rounds),
    )


def router_source() -> str:
    """Where the Router's code is imported from, and its git state: the tree may be mid-edit."""
    probe = "import reachmesh, os; print(os.path.dirname(os.path.dirname(reachmesh.__file__)))"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    where = found.stdout.strip() or "?"
    head = subprocess.run(
        ["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    if head.returncode != 0:
        return f"{where} (not a git checkout)"
    dirty = subprocess.run(
        ["git", "-C", where, "status", "--porcelain", "--", "."], capture_output=True, text=True, check=False
    )
    state = "with uncommitted changes" if dirty.stdout.strip() else "clean"
    return f"{where} (git {head.stdout.strip()}, {state})"


def ms(value: float) -> str:
    return f"{value:.3f} ms" if value < 10 else f"{value:.1f} ms"


def verdict(target: dict[str, Any]) -> str:
    failed = target.get("failed_requests", 0)
    if failed:
        return f"MISS ({failed} failed requests)"
    return "PASS" if target["pass"] else "MISS"


def wrk_version() -> str:
    done = subprocess.run(["wrk", "--version"], capture_output=True, text=True, check=False)
    first = (done.stdout or done.stderr).splitlines()[:1]
    return first[0].split(" [")[0].removeprefix("wrk ").strip() if first else "?"


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _terminated(signum: int, frame: Any) -> NoReturn:
    # SIGTERM goes down the same path as Ctrl-C, so the servers are stopped in `finally`.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed: run scripts/bench-deps", file=sys.stderr)
        return 2
    if not args.no_pin and shutil.which("taskset") is None:
        print("taskset is missing (util-linux); use --no-pin", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminated)
    # A shell starts background jobs with SIGINT ignored; Ctrl-C or kill -INT must still stop us.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    bench = Bench(args)
    started = time.monotonic()
    try:
        figures = bench.run()
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the servers", file=sys.stderr)
        return 130
    finally:
        bench.stop_all()
        if not args.keep_logs:
            shutil.rmtree(bench.workdir, ignore_errors=True)
    figures["settings"]["wall_s"] = round(time.monotonic() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    if args.keep_logs:
        print(f"logs kept in {bench.workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
