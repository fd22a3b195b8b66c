"""Found by an attacker's probe (round 48): the queue at a full agent was one line for every
client, first come first served, so one client could stand all of it: another client's call,
sent after its 20 waiting calls, was served 21st (with calls of a few seconds it timed out in the
queue). The line now takes turns between clients (PROTOCOL §15 as docs/protocol.md states it:
first come first served within each client), so it is served right after the call in flight
when it came, or the one after.
"""

from __future__ import annotations

import asyncio
from functools import partial

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until


async def test_another_clients_call_is_not_served_behind_one_clients_whole_queue() -> None:
    config = RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 10_000}}
    )
    async with RouterServer(config) as router:
        release = asyncio.Event()
        agent = FakeAgent("fair-line", tasks=("slow",), hold=release, max_concurrency=1)
        await agent.start()
        hog = httpx.AsyncClient(
            base_url=router.url,
            timeout=scaled(60),
            transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        )
        fair = httpx.AsyncClient(
            base_url=router.url,
            timeout=scaled(60),
            transport=httpx.AsyncHTTPTransport(local_address="127.0.0.3"),
        )
        board = router.app.parts.capacity
        try:
            assert (await hog.post("/agents", json=agent.profile())).status_code == 201
            # The call in flight is held at the agent while the others queue: its read timeout (3 s
            # by default, not scaled) must not end it first on a busy machine.
            body = {"targetTask": "slow", "preferences": {"timeoutMs": 60_000, "readTimeoutMs": 60_000}}
            hogs = [
                asyncio.create_task(hog.post("/reach", json={**body, "payload": {"who": "hog"}}))
                for _ in range(21)
            ]
            await until(lambda: board.queued("fair-line") == 20, "the hog's 20 calls waiting")
            mine = asyncio.create_task(fair.post("/reach", json={**body, "payload": {"who": "fair"}}))
            await until(lambda: board.queued("fair-line") == 21, "the fair call waiting")
            release.set()
            await asyncio.gather(mine, *hogs)
            order = [r["payload"]["who"] for r in agent.received]
            # Served right after the call in flight when it came, or the one after: not 21st.
            assert order.index("fair") <= 2, order.index("fair")
        finally:
            release.set()
            await hog.aclose()
            await fair.aclose()
            await agent.stop()


def _client(router: RouterServer, address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=router.url, timeout=scaled(60), transport=httpx.AsyncHTTPTransport(local_address=address)
    )


async def test_one_client_standing_the_whole_queue_gives_way_to_another_clients_call() -> None:
    """Found by a user's probe (round 50): one client whose calls filled the whole queue bound
    left every other client answered 429 until its calls left. Now the other client's call takes
    the place of the hog's newest waiter, which is answered at once: a whole ReachResponse, 429
    OVERLOADED with Retry-After, saying it was displaced. Nothing is charged to the agent."""
    config = RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000, "max_queued_per_agent": 5},
        }
    )
    async with RouterServer(config) as router:
        release = asyncio.Event()
        agent = FakeAgent("full-line", tasks=("slow",), hold=release, max_concurrency=1)
        await agent.start()
        hog, fair = _client(router, "127.0.0.2"), _client(router, "127.0.0.3")
        board = router.app.parts.capacity
        try:
            assert (await hog.post("/agents", json=agent.profile())).status_code == 201
            # The call in flight is held at the agent while the others queue: its read timeout (3 s
            # by default, not scaled) must not end it first on a busy machine.
            body = {"targetTask": "slow", "preferences": {"timeoutMs": 60_000, "readTimeoutMs": 60_000}}
            hogs = []
            for n in range(6):  # one in flight, five waiting: the whole bound, in order
                hogs.append(asyncio.create_task(hog.post("/reach", json={**body, "payload": {"who": n}})))
                await until(lambda: board.inflight("full-line") + board.queued("full-line") == len(hogs))
            refused = await hog.post("/reach", json={**body, "payload": {"who": "7th"}})
            assert refused.status_code == 429  # the hog holds the most: refused, as before
            mine = asyncio.create_task(fair.post("/reach", json={**body, "payload": {"who": "fair"}}))
            out = await asyncio.wait_for(hogs[5], scaled(10))  # answered at once, nothing released
            assert not release.is_set() and board.queued("full-line") == 5
            assert out.status_code == 429 and int(out.headers["Retry-After"]) >= 1
            answer = out.json()
            assert answer["status"] == "OVERLOADED" and answer["traceId"]
            assert answer["error"]["code"] == "OVERLOADED" and answer["error"]["retryAfterSeconds"] >= 1
            message = answer["error"]["message"]
            assert "displaced by another client's call" in message
            assert not message.startswith("the Router is shedding load"), message  # it is not
            (hop,) = (await hog.get(f"/admin/traces/{answer['traceId']}")).json()["hops"]
            (rejected,) = hop["decision"]["rejected"]
            assert (rejected["agentId"], rejected["reason"]) == ("full-line", "at_capacity")
            assert "displaced" in rejected["message"] and hop["status"] == "OVERLOADED", hop
            release.set()
            answers = await asyncio.gather(mine, *hogs[:5])
            assert [a.status_code for a in answers] == [200] * 6
            assert [r["payload"]["who"] for r in agent.received].index("fair") <= 2
            assert len(agent.received) == 6  # the displaced call never reached the agent
            view = (await hog.get("/admin/agents/full-line")).json()
            assert view["circuit"] == "closed" and view["stats"]["successRate"] == 1.0, view
            metrics = (await hog.get("/metrics")).text
            shed = [line for line in metrics.splitlines() if 'status="OVERLOADED"' in line]
            assert shed and shed[0].endswith(" 2.0"), shed  # the 7th refused, the 6th displaced
        finally:
            release.set()
            await hog.aclose()
            await fair.aclose()
            await agent.stop()


async def test_an_async_call_waiting_at_a_full_agent_gives_way_too_and_its_result_says_so() -> None:
    """mode async: the hog's jobs wait for the agent as its client's calls; the newest is
    displaced by the fair client's call, and its stored result is that whole OVERLOADED answer."""
    config = RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000, "max_queued_per_agent": 3},
        }
    )
    async with RouterServer(config) as router:
        release = asyncio.Event()
        agent = FakeAgent("async-line", tasks=("slow",), hold=release, max_concurrency=1)
        await agent.start()
        hog, fair = _client(router, "127.0.0.2"), _client(router, "127.0.0.3")
        board = router.app.parts.capacity
        try:
            assert (await hog.post("/agents", json=agent.profile())).status_code == 201
            # The call in flight is held at the agent while the others queue: its read timeout (3 s
            # by default, not scaled) must not end it first on a busy machine.
            prefs = {"timeoutMs": 60_000, "readTimeoutMs": 60_000, "mode": "async"}
            traces = []
            for n in range(4):  # one in flight, three waiting: the whole bound
                body = {"targetTask": "slow", "payload": {"who": n}, "preferences": prefs}
                accepted = await hog.post("/reach", json=body)
                assert accepted.status_code == 202
                traces.append(accepted.json()["traceId"])
                await until(lambda: board.inflight("async-line") + board.queued("async-line") == len(traces))
            body = {"targetTask": "slow", "payload": {"who": "fair"}, "preferences": {"timeoutMs": 60_000}}
            mine = asyncio.create_task(fair.post("/reach", json=body))
            result = await until(partial(_finished, hog, traces[3]), "the newest job's result")
            assert result.status_code == 429 and result.json()["status"] == "OVERLOADED"
            assert "displaced by another client's call" in result.json()["error"]["message"]
            release.set()
            assert (await mine).status_code == 200
            for trace in traces[:3]:
                done = await until(partial(_finished, hog, trace), "a job's result")
                assert done.status_code == 200
        finally:
            release.set()
            await hog.aclose()
            await fair.aclose()
            await agent.stop()


async def _finished(http: httpx.AsyncClient, trace_id: str) -> httpx.Response | None:
    answer = await http.get(f"/reach/{trace_id}")
    return None if answer.status_code == 202 else answer
