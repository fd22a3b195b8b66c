"""A poll of an async request still running says when to look again: ``Retry-After``.

Found by a stranger's walk: the 202 ACCEPTED of ``GET /reach/{traceId}`` gave no hint, so a
caller could only guess how often to poll. The hint is the task's usual async run time here
less what the request has run, in whole seconds from 1 to 5.
"""

from __future__ import annotations

import asyncio

import httpx

from reachmesh.config import AsyncPolicy, RouterConfig
from reachmesh.dispatch.asyncmode import POLL_AFTER_MAX_S, POLL_AFTER_MIN_S, AsyncRequests
from reachmesh.dispatch.results import Reply, ResultStore
from reachmesh.testing import FakeAgent, FakeTransport, ManualClock, RouterServer
from tests.helpers import scaled, until


class Held:
    """A run that ends when told: its answer waits for :meth:`end`."""

    def __init__(self) -> None:
        self.done = asyncio.Event()

    async def __call__(self) -> Reply:
        await self.done.wait()
        return 200, b'{"status":"SUCCESS"}'

    def end(self) -> None:
        self.done.set()


async def _run_once(
    runner: AsyncRequests, clock: ManualClock, trace_id: str, task: str, took_s: float
) -> None:
    held = Held()
    runner.start(trace_id, held, None, target=task)
    clock.advance(took_s)
    held.end()
    await until(lambda: runner.results.get(trace_id) is not None, f"{trace_id} finished", interval=0)


async def test_the_hint_is_the_tasks_usual_run_time_left_within_its_bounds() -> None:
    clock = ManualClock()
    policy = AsyncPolicy()
    runner = AsyncRequests(FakeTransport(clock), ResultStore(policy, clock=clock), policy, clock=clock)
    first = Held()
    runner.start("first", first, None, target="slow")
    assert runner.poll_after("first") == POLL_AFTER_MIN_S, "nothing to go on yet: the least"
    clock.advance(4)
    first.end()
    await until(lambda: runner.results.get("first") is not None, "first finished")
    second = Held()
    runner.start("second", second, None, target="slow")
    assert runner.poll_after("second") == 4, "a run of 'slow' takes 4 s here"
    clock.advance(1.5)
    assert runner.poll_after("second") == 3, "2.5 s of its usual time left, in whole seconds up"
    clock.advance(10)
    assert runner.poll_after("second") == POLL_AFTER_MIN_S, "past its usual time: the least"
    await _run_once(runner, clock, "b", "slower", 60.0)
    third = Held()
    runner.start("third", third, None, target="slower")
    assert runner.poll_after("third") == POLL_AFTER_MAX_S, "a minute's task: never over the most"
    assert runner.poll_after("unknown-id") == POLL_AFTER_MIN_S
    second.end()
    third.end()
    await runner.close()


async def test_a_caller_naming_a_new_task_each_time_does_not_grow_the_router() -> None:
    clock = ManualClock()
    policy = AsyncPolicy(max_results=10)
    runner = AsyncRequests(FakeTransport(clock), ResultStore(policy, clock=clock), policy, clock=clock)
    for n in range(300):
        await _run_once(runner, clock, f"t{n}", f"task-{n}", 1.0)
    assert len(runner._usual) == 256


async def test_a_poll_of_a_running_request_carries_retry_after() -> None:
    """Over HTTP: the 202 of a poll has a whole-second Retry-After; the final answer has none."""
    config = RouterConfig.model_validate({"embedding": {"backend": "none"}, "health": {"enabled": False}})
    release = asyncio.Event()
    async with (
        RouterServer(config) as router,
        httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http,
    ):
        agent = await FakeAgent("held", tasks=("slow",), hold=release).start()
        try:
            assert (await http.post("/agents", json=agent.profile())).status_code == 201
            prefs = {"mode": "async", "timeoutMs": 60_000, "readTimeoutMs": 60_000}
            body = {"traceId": "poll-1", "targetTask": "slow", "preferences": prefs}
            assert (await http.post("/reach", json=body)).status_code == 202
            polled = await http.get("/reach/poll-1")
            assert (polled.status_code, polled.json()["status"]) == (202, "ACCEPTED")
            assert polled.headers["retry-after"] == str(POLL_AFTER_MIN_S)
            release.set()

            async def finished() -> bool:
                return (await http.get("/reach/poll-1")).status_code == 200

            await until(finished, "the request finished")
            assert "retry-after" not in (await http.get("/reach/poll-1")).headers
        finally:
            release.set()
            await agent.stop()
