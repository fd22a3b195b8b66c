"""The SDK's own gate (issue #34): max_concurrency refuses the next call with a retryable busy
answer, and a repeated Idempotency-Key is answered from a short cache, the handler run once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from reachmesh import AgentConfig, ReachAgent
from reachmesh.exceptions import ConfigError
from reachmesh.testing import RouterServer, free_port
from tests.helpers import scaled, until


def config(router_url: str, **agent: object) -> AgentConfig:
    port = free_port()
    return AgentConfig.from_mapping(
        {
            "agent": {
                "id": "gated",
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": "work"}],
                **agent,
            },
            "router": {"url": router_url},
        },
        env={},
    )


def envelope(trace_id: str) -> dict[str, object]:
    return {"traceId": trace_id, "targetTask": "work", "payload": {}}


async def test_the_agent_refuses_the_call_past_its_max_concurrency_as_busy(router: RouterServer) -> None:
    """max_concurrency=2 given to ReachAgent: the Router is told (the profile), and a third call
    straight to the agent, past any Router, is answered 429 with Retry-After and a retryable
    AGENT_BUSY; once one ends, the next is served."""
    agent = ReachAgent(config(router.url), max_concurrency=2)
    release = asyncio.Event()
    running: list[str] = []

    @agent.capability("work")
    async def work(payload: dict) -> dict:
        running.append("x")
        await release.wait()
        return {"done": True}

    await agent.start()
    try:
        entry = router.app.parts.registry.get("gated")
        assert entry is not None and entry.profile.max_concurrency == 2
        url = agent.config.profile.network.endpoint
        async with httpx.AsyncClient(timeout=scaled(10)) as http:
            held = [asyncio.ensure_future(http.post(url, json=envelope(f"t{i}"))) for i in range(2)]
            await until(lambda: len(running) == 2, "two handlers running")
            busy = await http.post(url, json=envelope("t3"))
            assert busy.status_code == 429
            assert busy.headers["Retry-After"] == "1"
            assert busy.json()["error"]["code"] == "AGENT_BUSY"
            assert busy.json()["error"]["retryable"] is True
            release.set()
            assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]
            assert (await http.post(url, json=envelope("t4"))).json()["status"] == "SUCCESS"
    finally:
        release.set()
        await agent.stop()


async def test_a_slot_that_ends_within_the_grace_goes_to_the_waiting_call(router: RouterServer) -> None:
    """A Router keeping capacity sends its next queued call the moment an attempt ends at its
    deadline; the agent stops that handler a moment later. The call that arrives in between
    waits for the slot (up to the gate's grace) instead of being answered busy, and a call
    whose own deadline is shorter than the grace is answered busy within its deadline."""
    agent = ReachAgent(config(router.url), max_concurrency=1)
    release = asyncio.Event()
    running: list[str] = []

    @agent.capability("work")
    async def work(payload: dict) -> dict:
        running.append(str(payload.get("n")))
        if payload.get("hold"):
            await release.wait()
        return {"n": payload.get("n")}

    await agent.start()
    # Wide, so a loaded machine cannot make the deadline below outlast it.
    agent.gate.busy_grace_s = scaled(10)
    try:
        url = agent.config.profile.network.endpoint
        async with httpx.AsyncClient(timeout=scaled(20)) as http:
            first_body = {**envelope("t1"), "payload": {"n": 1, "hold": True}}
            deadline = {"X-Reach-Deadline-Ms": str(int(scaled(400)))}
            first = asyncio.ensure_future(http.post(url, json=first_body, headers=deadline))
            await until(lambda: running == ["1"], "the first handler running")
            second = asyncio.ensure_future(http.post(url, json={**envelope("t2"), "payload": {"n": 2}}))

            def answered_or_waiting() -> bool:
                return second.done() or getattr(agent.gate, "waiting", 0) == 1

            await until(answered_or_waiting, "the second call answered or waiting")
            assert not second.done(), f"answered at once: {second.result().status_code}"
            short = await http.post(url, json=envelope("t3"), headers={"X-Reach-Deadline-Ms": "50"})
            assert short.status_code == 429
            assert short.json()["error"]["code"] == "AGENT_BUSY"
            ended = await first
            assert ended.json()["error"]["code"] == "DEADLINE_EXCEEDED"
            served = await second
            assert (served.status_code, served.json()["result"]) == (200, {"n": 2})
            assert agent.gate.inflight == 0 and agent.gate.waiting == 0
    finally:
        release.set()
        await agent.stop()


async def test_the_config_file_key_declares_it(router: RouterServer) -> None:
    agent = ReachAgent(config(router.url, max_concurrency=3))
    assert agent.config.profile.max_concurrency == 3
    assert agent.gate.max_concurrency == 3
    with pytest.raises(ValueError, match="max_concurrency"):
        ReachAgent(config(router.url), max_concurrency=0)


async def test_a_repeated_idempotency_key_is_answered_from_the_cache(router: RouterServer) -> None:
    """The same key twice (the second while the first still runs, the third after it ended): the
    handler runs once, and every copy gets its answer; another key runs it again."""
    agent = ReachAgent(config(router.url))
    release = asyncio.Event()
    runs: list[int] = []

    @agent.capability("work")
    async def work(payload: dict) -> dict:
        runs.append(1)
        await release.wait()
        return {"run": len(runs)}

    await agent.start()
    try:
        url = agent.config.profile.network.endpoint
        headers = {"Idempotency-Key": "trace-1.abc"}
        async with httpx.AsyncClient(timeout=scaled(10)) as http:
            first = asyncio.ensure_future(http.post(url, json=envelope("trace-1"), headers=headers))
            await until(lambda: runs, "the first copy running")
            second = asyncio.ensure_future(http.post(url, json=envelope("trace-1"), headers=headers))
            await until(lambda: agent.gate.inflight == 1 and len(agent.gate._answers) == 1, "repeat seen")
            release.set()
            answers = [(await first).json(), (await second).json()]
            third = (await http.post(url, json=envelope("trace-1"), headers=headers)).json()
            other = (
                await http.post(url, json=envelope("trace-1"), headers={"Idempotency-Key": "trace-1.def"})
            ).json()
        assert [a["result"] for a in answers] == [{"run": 1}, {"run": 1}]
        assert third["result"] == {"run": 1}
        assert other["result"] == {"run": 2}
        assert len(runs) == 2
    finally:
        release.set()
        await agent.stop()


async def test_a_known_key_with_another_request_runs_that_request(router: RouterServer) -> None:
    """A key is a repeat only with the same task and payload. An async request's key follows
    from its trace id, which a caller may reuse (or another may know): a second request under a
    key the agent saw got the first one's answer, never running (and read another's result)."""
    agent = ReachAgent(config(router.url))

    @agent.capability("work")
    async def work(payload: dict) -> dict:
        return {"asked": payload.get("q")}

    await agent.start()
    try:
        url = agent.config.profile.network.endpoint
        headers = {"Idempotency-Key": "trace-7.0123456789abcdef"}
        async with httpx.AsyncClient(timeout=scaled(10)) as http:

            async def ask(q: str) -> object:
                body = {**envelope("trace-7"), "payload": {"q": q}}
                return (await http.post(url, json=body, headers=headers)).json()["result"]

            assert await ask("mine") == {"asked": "mine"}
            assert await ask("theirs") == {"asked": "theirs"}
            assert await ask("mine") == {"asked": "mine"}  # the first is still a repeat
    finally:
        await agent.stop()


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3", 10**9])
def test_a_max_concurrency_that_is_not_a_count_is_refused(bad: object) -> None:
    """True (an int to Python) and 2.5 were taken: the gate let 3 run for 2.5, and the profile
    told the Router true; "3" raised a TypeError from a comparison instead of a clear error."""
    with pytest.raises(ValueError, match="max_concurrency must be an integer"):
        ReachAgent(config("http://127.0.0.1:9"), max_concurrency=bad)  # type: ignore[arg-type]


async def test_the_repeat_cache_is_bounded_by_its_bytes_in_all(router: RouterServer) -> None:
    """Answers of 40 KB each (under the per-answer bound) under five keys, with 100 KB of cache:
    the count and per-answer bounds alone let 1,024 such answers (64 MiB) stay. Now the answers
    kept hold 100 KB at most, the oldest forgotten first: a repeat of the first key runs its
    handler again, a repeat of the last is answered from the cache."""
    agent = ReachAgent(config(router.url), repeat_cache_bytes=100_000)
    runs: list[int] = []

    @agent.capability("work")
    async def work(payload: dict) -> dict:
        runs.append(payload["n"])
        return {"n": payload["n"], "pad": "x" * 40_000}

    await agent.start()
    try:
        url = agent.config.profile.network.endpoint

        async def post(n: int) -> httpx.Response:
            body = {"traceId": f"trace-{n}", "targetTask": "work", "payload": {"n": n}}
            return await http.post(url, json=body, headers={"Idempotency-Key": f"trace-{n}.k"})

        async with httpx.AsyncClient(timeout=scaled(10)) as http:
            for n in range(5):
                assert (await post(n)).json()["result"]["n"] == n
            assert agent.gate.bytes_held <= 100_000
            assert len(agent.gate._answers) == 2
            assert (await post(4)).json()["result"]["n"] == 4  # kept: not run again
            assert runs == [0, 1, 2, 3, 4]
            assert (await post(0)).json()["result"]["n"] == 0  # forgotten: run again
            assert runs == [0, 1, 2, 3, 4, 0]
    finally:
        await agent.stop()


def test_the_repeat_cache_size_is_a_config_key_with_a_default() -> None:
    url = "http://127.0.0.1:1"
    assert ReachAgent(config(url)).gate.max_bytes == 16 * 1024 * 1024
    port = free_port()
    mapping = {
        "agent": {
            "id": "gated",
            "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
            "capabilities": [{"task": "work"}],
        },
        "server": {"repeat_cache_bytes": 1_000_000},
    }
    assert ReachAgent(AgentConfig.from_mapping(mapping, env={})).gate.max_bytes == 1_000_000
    with pytest.raises(ConfigError, match=r"server\.repeat_cache_bytes"):
        AgentConfig.from_mapping({**mapping, "server": {"repeat_cache_bytes": "16MB"}}, env={})
    with pytest.raises(ValueError, match="repeat_cache_bytes"):
        ReachAgent(config(url), repeat_cache_bytes=-1)
