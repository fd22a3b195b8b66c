"""SIGTERM on a real Router process: it drains within its deadline, and no async request vanishes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from aiohttp import web

from reachmesh.testing import BackgroundLoop, FakeAgent, free_port
from tests.helpers import scaled
from tests.procs import Proc, wait_for

DRAIN_S = 3.0


class Listener:
    """A replyTo listener on loopback that keeps every body it is sent."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/replies"
        self.bodies: list[dict] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/replies", self._take)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _take(self, request: web.Request) -> web.Response:
        self.bodies.append(orjson.loads(await request.read()))
        return web.Response(status=204)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.mark.e2e
def test_sigterm_delivers_or_reports_every_accepted_async_request(tmp_path: Path) -> None:
    """Two quick and five stuck async requests, then SIGTERM: the process exits within the drain
    deadline; the quick ones are delivered, the stuck ones are logged and answered TIMEOUT."""
    port = free_port()
    policy = tmp_path / "router.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "server": {"drain_timeout_seconds": DRAIN_S},
                "embedding": {"backend": "none"},
                "health": {"enabled": False},
            }
        )
    )
    router = Proc(["router", "--port", str(port), "--config", str(policy)], tmp_path / "router.log")
    url = f"http://127.0.0.1:{port}"
    with BackgroundLoop() as bg:
        listener = Listener()
        bg.run(listener.start())
        bg.on_close(listener.stop)
        quick = bg.run(FakeAgent("quick", tasks=("quick",)).start())
        stuck = bg.run(FakeAgent("stuck", tasks=("stuck",), delay_s=60).start())
        bg.on_close(quick.stop)
        bg.on_close(stuck.stop)
        try:
            wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=20)
            for agent in (quick, stuck):
                bg.run(agent.register(url, vectors=False))
            prefs = {"mode": "async", "replyTo": listener.url, "timeoutMs": 120_000, "readTimeoutMs": 120_000}
            for task, count in (("stuck", 5), ("quick", 2)):
                for i in range(count):
                    body = {"traceId": f"{task}-{i}", "targetTask": task, "preferences": prefs}
                    assert httpx.post(f"{url}/reach", json=body).status_code == 202
            wait_for(lambda: len(listener.bodies) == 2 and len(stuck.received) == 5, timeout=10)
            started = time.monotonic()
            router.signal(signal.SIGTERM)
            code = router.popen.wait(DRAIN_S + scaled(10))
            took = time.monotonic() - started
            wait_for(lambda: len(listener.bodies) == 7, what="all seven replies at replyTo")
        finally:
            router.stop()
    log = router.text()
    print(f"\nSIGTERM to exit: {took:.2f} s (drain deadline {DRAIN_S:g} s)")
    # uvicorn re-raises the signal once it has shut down, so the exit status says SIGTERM.
    assert code in (0, -signal.SIGTERM), log[-2000:]
    assert took < DRAIN_S + scaled(3), log[-2000:]
    answers = {b["traceId"]: b["status"] for b in listener.bodies}
    assert answers == {
        "quick-0": "SUCCESS",
        "quick-1": "SUCCESS",
        **{f"stuck-{i}": "TIMEOUT" for i in range(5)},
    }
    for i in range(5):
        assert f"[stuck-{i}] async request abandoned at shutdown" in log
    assert "Traceback" not in log


@pytest.mark.e2e
def test_sigterm_exits_within_the_drain_deadline_while_a_big_profile_is_embedded(tmp_path: Path) -> None:
    """A registration with 200 long examples is still being embedded when SIGTERM arrives: the
    process still exits within the drain deadline, without a traceback."""
    from tests.semantic.test_registration_load import big_profile

    port = free_port()
    policy = tmp_path / "router.yaml"
    policy.write_text(
        yaml.safe_dump({"server": {"drain_timeout_seconds": DRAIN_S}, "health": {"enabled": False}})
    )
    router = Proc(["router", "--port", str(port), "--config", str(policy)], tmp_path / "router.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=30)
        assert httpx.post(f"{url}/agents", json=big_profile("big", 16, 200, 480)).status_code == 201
        assert httpx.get(f"{url}/admin/agents/big").json()["vectors"] == "pending"
        started = time.monotonic()
        router.signal(signal.SIGTERM)
        code = router.popen.wait(DRAIN_S + scaled(10))
        took = time.monotonic() - started
    finally:
        router.stop()
    print(f"\nSIGTERM to exit while embedding: {took:.2f} s (drain deadline {DRAIN_S:g} s)")
    assert code in (0, -signal.SIGTERM), router.text()[-2000:]
    assert took < DRAIN_S + scaled(2)
    assert "Traceback" not in router.text()


@pytest.mark.e2e
def test_sigterm_answers_every_running_sync_call_timeout(tmp_path: Path) -> None:
    """Three sync calls stuck at an agent, then SIGTERM to the real process: each caller gets its
    504 TIMEOUT ReachResponse (never a bare 500 text/plain), the log says each was abandoned and
    has no "Exception in ASGI application", and the process exits within the drain deadline."""
    port = free_port()
    policy = tmp_path / "router.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "server": {"drain_timeout_seconds": DRAIN_S},
                "embedding": {"backend": "none"},
                "health": {"enabled": False},
                "timeouts": {"read_ms": 60_000, "overall_ms": 120_000},
            }
        )
    )
    router = Proc(["router", "--port", str(port), "--config", str(policy)], tmp_path / "router.log")
    url = f"http://127.0.0.1:{port}"
    with BackgroundLoop() as bg:
        stuck = bg.run(FakeAgent("stuck", tasks=("stuck",), delay_s=60).start())
        bg.on_close(stuck.stop)

        async def call(i: int) -> httpx.Response:
            async with httpx.AsyncClient(timeout=30) as http:
                return await http.post(f"{url}/reach", json={"traceId": f"sync-{i}", "targetTask": "stuck"})

        try:
            wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=20)
            bg.run(stuck.register(url, vectors=False))
            calls = [asyncio.run_coroutine_threadsafe(call(i), bg.loop) for i in range(3)]
            wait_for(lambda: len(stuck.received) == 3, timeout=10)
            started = time.monotonic()
            router.signal(signal.SIGTERM)
            answers = [c.result(DRAIN_S + 10) for c in calls]
            code = router.popen.wait(DRAIN_S + 10)
            took = time.monotonic() - started
        finally:
            router.stop()
    log = router.text()
    assert code in (0, -signal.SIGTERM), log[-2000:]
    assert took < DRAIN_S + scaled(3), log[-2000:]
    for i, resp in enumerate(answers):
        assert resp.status_code == 504, resp.text
        assert resp.headers["content-type"] == "application/json"
        assert (resp.json()["status"], resp.json()["traceId"]) == ("TIMEOUT", f"sync-{i}")
        assert f"[sync-{i}] request abandoned at shutdown: answered TIMEOUT" in log
    assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-2000:]


@pytest.mark.e2e
def test_a_router_its_sigterm_does_not_end_exits_without_waiting_for_the_embedder(tmp_path: Path) -> None:
    """As PID 1 in a container (the Dockerfile's CMD) the SIGTERM uvicorn raises again once the
    Router has stopped ends nothing, and the process ends when its main thread returns: that end
    waited for the embedder's batch under way (here a big registration's), 4.4 s after "stopped"
    on a busy 2-core host. A parent that ignores SIGTERM gives its child the same."""
    from tests.semantic.test_registration_load import big_profile

    port = free_port()
    policy = tmp_path / "router.yaml"
    policy.write_text(
        yaml.safe_dump({"server": {"drain_timeout_seconds": DRAIN_S}, "health": {"enabled": False}})
    )
    log_path = tmp_path / "router.log"
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as out:
        router = subprocess.Popen(
            [sys.executable, "-m", "reachmesh", "router", "--port", str(port), "--config", str(policy)],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
        )
        try:
            wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=30)
            wait_for(lambda: "semantic routing: embedder" in log_path.read_text(), timeout=30)
            assert httpx.post(f"{url}/agents", json=big_profile("big", 16, 200, 480)).status_code == 201
            assert httpx.get(f"{url}/admin/agents/big").json()["vectors"] == "pending"
            started = time.monotonic()
            router.send_signal(signal.SIGTERM)
            code = router.wait(DRAIN_S + scaled(30))
            took = time.monotonic() - started
        finally:
            if router.poll() is None:
                router.kill()
                router.wait()
    log = log_path.read_text()
    print(f"\nSIGTERM to exit, SIGTERM not ending the process, while embedding: {took:.2f} s")
    assert code == 0, log[-2000:]
    assert "[router] stopped" in log, log[-2000:]
    assert took < scaled(2), log[-2000:]
