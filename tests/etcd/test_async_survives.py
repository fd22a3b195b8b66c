"""Async requests that outlive their Router (issue #38): Router processes over one etcd.

The agent is an in-process FakeAgent that holds every request until the test lets go, and counts
the runs of each request by its X-Reach-Idempotency-Key; replyTo is a small server here too.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from reachmesh import jsoncodec
from reachmesh.cli.etcd import EtcdCluster
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer, free_port
from tests.etcd.conftest import etcd_policy
from tests.etcd.test_processes import EtcdRouters
from tests.helpers import scaled, until
from tests.procs import wait_for

pytestmark = pytest.mark.etcd

N = 100


class Replies:
    """A replyTo listener: the traceIds it was sent, with how many times each."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/replies"
        self.seen: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/replies", self._take)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _take(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("status") == "SUCCESS":
            self.seen[request.headers["X-Reach-Trace-Id"]] += 1
        return web.Response(status=204)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
def bg() -> Iterator[BackgroundLoop]:
    with BackgroundLoop() as loop:
        yield loop


def start_routers(tmp_path: Path, etcd: EtcdCluster, n: int) -> tuple[EtcdRouters, list[str]]:
    policy = {
        # The FakeAgent registers once and never renews: a lease that outlasts the test.
        "registry": {"lease_ttl_seconds": 600},
        # A dead Router's claims go within about 2 s (etcd's shortest lease), looked for often.
        "async_mode": {"claim_ttl_seconds": 2, "adopt_interval_seconds": 0.2},
    }
    group = EtcdRouters(tmp_path, etcd, policy)
    ports = [free_port() for _ in range(n)]
    for i, port in enumerate(ports):
        group.router(port, log=f"router{i}")
    return group, [f"http://127.0.0.1:{port}" for port in ports]


def listed_everywhere(http: httpx.Client, urls: list[str], agent_id: str) -> None:
    for url in urls:

        def listed(url: str = url) -> bool:
            return http.get(f"{url}/admin/agents/{agent_id}").status_code == 200

        wait_for(listed, timeout=20)


def send_async(http: httpx.Client, url: str, reply_to: str | None) -> str:
    # Held at the agent until the test lets go: no attempt may time out meanwhile (the default
    # read timeout is a few seconds, and a loaded machine takes that to send a hundred).
    prefs: dict[str, object] = {"mode": "async", "timeoutMs": 60_000, "readTimeoutMs": 60_000}
    if reply_to is not None:
        prefs["replyTo"] = reply_to
    resp = http.post(f"{url}/reach", json={"targetTask": "hold", "payload": {}, "preferences": prefs})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["traceId"])


def test_a_result_accepted_by_one_router_is_readable_through_another(tmp_path, etcd, bg) -> None:
    group, (url_a, url_b) = start_routers(tmp_path, etcd, 2)
    agent = FakeAgent("quick", tasks=("hold",))
    try:
        bg.run(agent.start())
        bg.on_close(agent.stop)
        bg.run(agent.register(url_a, vectors=False))
        trace_id = send_async(group.http, url_a, None)

        def done_at_b() -> bool:
            resp = group.http.get(f"{url_b}/reach/{trace_id}")
            return resp.status_code == 200 and resp.json()["status"] == "SUCCESS"

        wait_for(done_at_b, timeout=20, what="the result through B")
        unknown = group.http.get(f"{url_b}/reach/{'f' * 32}")
        assert unknown.status_code == 404
        assert agent.headers[0]["X-Reach-Idempotency-Key"] == f"{trace_id}:async"
    finally:
        group.stop()


# Three Router processes and a hundred requests: minutes on a loaded 2-core machine.
@pytest.mark.timeout(scaled(100))
def test_accepted_async_requests_survive_the_kill_of_their_router(tmp_path, etcd, bg) -> None:
    """100 accepted by A, held at the agent; A killed -9: all finish, results at B and C,
    every replyTo called, no request run more than twice."""
    group, (url_a, url_b, url_c) = start_routers(tmp_path, etcd, 3)
    hold: asyncio.Event = bg.run(_event())
    agent = FakeAgent("holder", tasks=("hold",), hold=hold)
    replies = Replies()
    try:
        bg.run(agent.start())
        bg.on_close(agent.stop)
        bg.run(replies.start())
        bg.on_close(replies.stop)
        bg.run(agent.register(url_a, vectors=False))
        listed_everywhere(group.http, [url_a, url_b, url_c], "holder")
        traces = [send_async(group.http, url_a, replies.url) for _ in range(N)]
        wait_for(lambda: len(agent.received) >= N, timeout=30, what="every request held at the agent")
        router_a = group.procs[0]
        router_a.signal(signal.SIGKILL)
        router_a.popen.wait()
        killed = time.monotonic()
        # Nothing had finished: every answer was held.
        assert not replies.seen
        bg.loop.call_soon_threadsafe(hold.set)

        def all_readable(url: str) -> bool:
            return all(group.http.get(f"{url}/reach/{t}").json().get("status") == "SUCCESS" for t in traces)

        wait_for(lambda: all_readable(url_b), timeout=60, interval=0.2, what="every result through B")
        took = time.monotonic() - killed
        assert all_readable(url_c)
        wait_for(lambda: set(replies.seen) == set(traces), timeout=60, what="every replyTo called")
        runs = Counter(h.get("X-Reach-Idempotency-Key") for h in agent.headers)
        assert set(runs) == {f"{t}:async" for t in traces}
        per_run = dict(Counter(runs.values()))
        per_reply = dict(Counter(replies.seen.values()))
        print(
            f"{N} requests: results at B and C {took:.2f} s after kill; runs {per_run}; replyTo {per_reply}"
        )
        assert max(runs.values()) <= 2
        adopted = sum(proc.text().count("adopted an async request") for proc in group.procs[1:])
        assert adopted == N  # each adopted once, by B or C
    finally:
        group.stop()


async def _event() -> asyncio.Event:
    return asyncio.Event()


def test_a_request_too_large_for_etcd_is_refused_before_it_is_accepted(tmp_path, etcd) -> None:
    group, (url_a,) = start_routers(tmp_path, etcd, 1)
    try:
        big = {"blob": "x" * (70 * 1024)}
        resp = group.http.post(
            f"{url_a}/reach", json={"targetTask": "hold", "payload": big, "preferences": {"mode": "async"}}
        )
        assert resp.status_code == 413, resp.text
        assert "async_mode.etcd_max_request_bytes" in resp.json()["error"]["message"]
    finally:
        group.stop()


async def test_a_finished_request_whose_router_died_while_delivering_is_delivered_not_run(
    etcd, client
) -> None:
    """A job left in etcd with its result and no claim (its Router died delivering replyTo): the
    adopting Router delivers the stored result and drops the job; the agent is not called."""
    replies = Replies()
    await replies.start()
    agent = await FakeAgent("quick", tasks=("hold",)).start()
    policy = etcd_policy(etcd, async_mode={"adopt_interval_seconds": 0.05}, health={"enabled": False})
    try:
        async with RouterServer(policy) as b:
            await agent.register(b.url, vectors=False)
            journal = b.app.parts.dispatcher.async_requests.journal
            assert journal is not None
            trace_id = "d" * 32
            envelope = {"targetTask": "hold", "traceId": trace_id, "preferences": {"mode": "async"}}
            answer = {"status": "SUCCESS", "traceId": trace_id, "result": {"from": "the dead Router"}}
            job = {
                "envelope": jsoncodec.dumps(envelope).decode(),
                "owner": None,
                "replyTo": replies.url,
                "attempt": 1,
            }
            stored = {
                "status": 200,
                "owner": None,
                "body": base64.b64encode(jsoncodec.dumps(answer)).decode(),
            }
            await journal.client.put(journal.results + trace_id, jsoncodec.dumps(stored))
            await journal.client.put(journal.jobs + trace_id, jsoncodec.dumps(job))
            await until(lambda: replies.seen, "the stored result at replyTo", within=20)
            assert replies.seen == Counter({trace_id: 1})

            async def dropped() -> bool:
                return await journal.job(trace_id) is None

            await until(dropped, "the job dropped from etcd", within=20)
            fetched = (await client.get(f"{b.url}/reach/{trace_id}")).json()
            assert fetched["result"] == {"from": "the dead Router"}
            assert agent.received == []
    finally:
        await agent.stop()
        await replies.stop()


async def test_a_router_stopped_gracefully_hands_its_unfinished_requests_to_another(etcd, client) -> None:
    """SIGTERM-like stop with a request still running: not answered TIMEOUT, but released, and
    another Router adopts it at once (long before its claim lease would run out)."""
    hold = asyncio.Event()
    agent = await FakeAgent("holder", tasks=("hold",), hold=hold).start()
    policy = etcd_policy(
        etcd,
        async_mode={"adopt_interval_seconds": 0.05, "claim_ttl_seconds": 600},
        server={"drain_timeout_seconds": 0.2},
        health={"enabled": False},
    )
    try:
        async with RouterServer(policy) as b:
            async with RouterServer(policy) as a:
                await agent.register(a.url, vectors=False)
                accepted = await client.post(
                    f"{a.url}/reach", json={"targetTask": "hold", "preferences": {"mode": "async"}}
                )
                assert accepted.status_code == 202, accepted.text
                trace_id = accepted.json()["traceId"]
                await until(lambda: agent.received, "the request held at the agent")
            hold.set()

            async def finished_at_b() -> bool:
                resp = await client.get(f"{b.url}/reach/{trace_id}")
                return resp.status_code == 200 and bool(resp.json()["status"] == "SUCCESS")

            await until(finished_at_b, "the request finished by B", within=20)
            assert b.app.parts.adopter is not None and b.app.parts.adopter.adopted == 1
    finally:
        await agent.stop()


async def test_a_router_whose_claim_lease_lapsed_does_not_run_its_own_request_again(etcd, client) -> None:
    """Its claim lease gone (etcd out of reach too long, here revoked): the Router finds its own
    running request orphaned, claims it again under a new lease, and does not run it twice."""
    hold = asyncio.Event()
    agent = await FakeAgent("holder", tasks=("hold",), hold=hold).start()
    policy = etcd_policy(
        etcd, async_mode={"adopt_interval_seconds": 0.05, "claim_ttl_seconds": 3}, health={"enabled": False}
    )
    try:
        async with RouterServer(policy) as a:
            await agent.register(a.url, vectors=False)
            journal = a.app.parts.dispatcher.async_requests.journal
            assert journal is not None
            # The request is held at the agent across a lease revoke and a new claim in etcd: its
            # read timeout (3 s by default, not scaled) must not end it first on a busy machine.
            held_ms = int(scaled(30_000))
            prefs = {"mode": "async", "timeoutMs": held_ms, "readTimeoutMs": held_ms}
            accepted = await client.post(f"{a.url}/reach", json={"targetTask": "hold", "preferences": prefs})
            trace_id = accepted.json()["traceId"]
            await until(lambda: agent.received, "the request held at the agent")
            lapsed = journal.lease
            await journal.client.revoke(lapsed)

            async def claimed_again() -> bool:
                _, claim = await journal.client.get(journal.claims + trace_id)
                return claim is not None and claim.lease not in (0, lapsed)

            await until(claimed_again, "the claim under a new lease", within=20)
            hold.set()

            async def finished() -> bool:
                resp = await client.get(f"{a.url}/reach/{trace_id}")
                return bool(resp.json()["status"] == "SUCCESS")

            await until(finished, "the request finished", within=20)
            assert len(agent.received) == 1
            assert a.app.parts.adopter is not None and a.app.parts.adopter.adopted == 0
    finally:
        await agent.stop()
