"""The load shedder sheds the Router's own overload: sustained lag *and* real work, not lag alone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from aiohttp import web

from reachmesh.config import LimitsPolicy, RouterConfig
from reachmesh.resilience.shedding import LoadShedder
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer
from tests.helpers import cpu_hogs, hogs_running, scaled, until

LAGGING = 400.0  # ms: what a saturated host does to every tick


def shedder(**limits: Any) -> LoadShedder:
    policy = LimitsPolicy.model_validate({"max_inflight": 100, "loop_lag_window_seconds": 1.0, **limits})
    return LoadShedder(policy)


def lag_for(shed: LoadShedder, start: float, end: float, *, step: float = 0.45) -> float:
    """Feed a late sample every ``step`` s from ``start`` until ``end`` is covered (a loop lagging
    400 ms ticks about that often); returns the time of the last one."""
    now = start
    shed.observe(LAGGING, now)
    while now < end:
        now += step
        shed.observe(LAGGING, now)
    return now


def fill(shed: LoadShedder, count: int) -> None:
    for _ in range(count):
        assert shed.admit() is None


def test_one_slow_tick_with_much_work_is_not_shed() -> None:
    """A single late tick (a GC pause, one big answer) is not overload, however busy the Router."""
    shed = shedder()
    fill(shed, 60)
    shed.observe(5_000, 10.0)
    assert shed.admit() is None


def test_sustained_lag_with_a_light_load_is_served() -> None:
    """A slow host lags every tick; with a handful of requests in flight the Router still serves."""
    shed = shedder()
    now = lag_for(shed, 0.0, 3.0)
    assert shed.sustained_lag_s >= 1.0
    fill(shed, 2)  # under the share (10 of 100) and under its growth step (3) per window
    now = lag_for(shed, now, now + 1.5)
    fill(shed, 2)  # a load that rises slowly is not a queue building
    lag_for(shed, now, now + 1.5)
    fill(shed, 2)
    assert shed.inflight == 6


def test_sustained_lag_with_real_work_is_shed() -> None:
    """Lag over the whole window with in-flight at the share of max_inflight: shed, saying why."""
    shed = shedder()
    fill(shed, 10)
    lag_for(shed, 0.0, 1.0)
    reason = shed.admit()
    assert reason is not None
    assert "event loop lag 400 ms" in reason
    assert "10 requests in flight" in reason
    # A quiet tick closes the gate at once: the next request is served.
    shed.observe(1.0, 1.5)
    assert shed.admit() is None


def test_a_growing_queue_under_lag_is_shed_before_the_share() -> None:
    """In flight rising by a quarter of the share within the window is a queue building: shed."""
    shed = shedder()
    now = lag_for(shed, 0.0, 1.0)
    fill(shed, 3)
    assert shed.admit() is not None
    # The same three in flight held steady for a whole window are a light load again.
    lag_for(shed, now + 0.45, now + 1.5)
    assert shed.admit() is None


def test_the_lag_gate_can_be_switched_off_and_set_to_lag_alone() -> None:
    """``loop_lag_shedding: false`` never sheds on lag; share 0 sheds on sustained lag alone."""
    off = shedder(loop_lag_shedding=False)
    fill(off, 50)
    lag_for(off, 0.0, 5.0)
    assert off.admit() is None
    alone = shedder(loop_lag_inflight_share=0)
    lag_for(alone, 0.0, 1.0)
    assert alone.admit() is not None


async def busy_host() -> float:
    """The lag source of a host saturated by other processes: every tick 400 ms late."""
    await asyncio.sleep(0.05)
    return LAGGING


LIGHT_POLICY = {
    "embedding": {"backend": "none"},
    "health": {"enabled": False},
    # The share (0.1) is 20 in flight, a growing queue 5 more within the window.
    "limits": {
        "loop_lag_shedding": True,  # the suite's Routers start without it
        "max_inflight": 200,
        "loop_lag_window_seconds": 0.3,
        "retry_after_seconds": 3,
    },
}


async def test_a_light_load_on_a_saturated_host_is_served_and_a_storm_is_shed() -> None:
    """Real CPU hogs saturate the host and the loop lags past the limit for the whole window; a
    light load is served (slower), then a storm on the same Router is shed with 429 Retry-After."""
    with cpu_hogs() as hogs:
        server = RouterServer(RouterConfig.model_validate(LIGHT_POLICY))
        shed = server.app.parts.shedder
        shed.lag_source = busy_host
        async with server, httpx.AsyncClient(base_url=server.url, timeout=scaled(30)) as http:
            agent = await FakeAgent("a").start()
            try:
                await agent.register(server.url)
                await until(lambda: shed.sustained_lag_s >= 0.3, "the lag to be sustained for a window")
                call = {"targetTask": "echo"}
                for _ in range(10):
                    pair = await asyncio.gather(*(http.post("/reach", json=call) for _ in "ab"))
                    assert [r.json()["status"] for r in pair] == ["SUCCESS", "SUCCESS"]
                assert hogs_running(hogs)
                assert shed.sustained_lag_s >= 0.3  # the lag held all along: only the load was light
                # The control: the same lagging Router with a storm of slow requests sheds.
                agent.delay_s = 2.0  # held in flight, then answered
                # The admitted calls are answered together after the delay, on a saturated host:
                # the default read timeout (3 s, not scaled) must not end them first.
                held_ms = int(scaled(20_000))
                slow = {**call, "preferences": {"timeoutMs": held_ms, "readTimeoutMs": held_ms}}
                storm = await asyncio.gather(*(http.post("/reach", json=slow) for _ in range(60)))
            finally:
                await agent.stop()
    refused = [r for r in storm if r.status_code == 429]
    assert refused, "a storm on a lagging Router must be shed"
    assert refused[0].headers["retry-after"] == "3"
    assert refused[0].json()["status"] == "OVERLOADED"
    assert "event loop lag" in refused[0].json()["error"]["message"]
    assert any(r.status_code == 200 for r in storm)


class LoopBlockingAgent(FakeAgent):
    """A FakeAgent that shares the Router's event loop (both run on one BackgroundLoop) and blocks
    it for ``block_s`` on every call: work on the Router's loop between admitting a request and
    answering it, which the Router cannot skip however it writes its answers (an earlier version
    slowed ASGI ``send``, which the Router's whole-answer write never calls)."""

    block_s: float = 0.1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        time.sleep(self.block_s)  # noqa: ASYNC251 - the point: this blocks the shared event loop
        return await super()._handle(request)


async def test_a_real_storm_that_lags_the_loop_is_shed_and_healthz_answers() -> None:
    """Measured lag, not an injected one: each call costs the Router's loop 100 ms; 40 concurrent
    callers (on their own loop, as remote callers are) lag it past the limit while it holds 20+
    requests in flight, and the excess is shed while /healthz still answers.

    A call is that slow so that the callers outpace the loop on a loaded machine too (at 20 ms,
    callers starved of CPU kept too few calls in flight and the lag came and went)."""
    config = RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {
                "loop_lag_shedding": True,  # the suite's Routers start without it
                "max_inflight": 200,  # the share (0.1) is 20 in flight
                "loop_lag_ms": 40,
                "loop_lag_window_seconds": 0.3,
                "retry_after_seconds": 2,
            },
        }
    )
    with BackgroundLoop() as bg:
        server = RouterServer(config)
        bg.run(server.__aenter__())
        bg.on_close(lambda: server.__aexit__(None, None, None))
        agent = LoopBlockingAgent("a")
        bg.run(agent.start())
        bg.on_close(agent.stop)
        bg.run(agent.register(server.url))
        # A fresh connection per call: a kept-alive one can be closed by a Router whose loop lags
        # past its keep-alive timeout just as the next call is sent on it (a ReadError, not a 429).
        fresh = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=scaled(60), limits=fresh) as http:
            shed: list[httpx.Response] = []
            loop = asyncio.get_running_loop()
            end = loop.time() + scaled(30)

            async def caller() -> None:
                while not shed and loop.time() < end:
                    resp = await http.post("/reach", json={"targetTask": "echo"})
                    if resp.status_code == 429:
                        shed.append(resp)

            callers = [asyncio.create_task(caller()) for _ in range(40)]
            try:
                await until(lambda: shed, "a 429 from the storm", within=30)
                health = await http.get("/healthz")
            finally:
                await asyncio.gather(*callers)
    assert health.status_code == 200
    assert shed[0].headers["retry-after"] == "2"
    body = shed[0].json()
    assert body["status"] == "OVERLOADED"
    assert "event loop lag" in body["error"]["message"]
    assert server.app.parts.shedder.peak_lag_ms >= 40
