"""A restarted instance that takes its id over starts with a closed breaker and fresh statistics.

The old instance's refused connection opened the breaker; that says nothing about the new one,
which the docs promise is routed to at once.
"""

from __future__ import annotations

import httpx

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

CALL = {"targetTask": "echo", "payload": {"text": "hi"}, "preferences": {"timeoutMs": 3000}}


async def test_a_takeover_starts_with_a_closed_breaker() -> None:
    policy = RouterConfig.from_mapping({"embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 60_000}})
    async with RouterServer(policy) as server, httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        old = await FakeAgent("restarter").start()
        await old.register(server.url, vectors=False)
        await old.stop()  # killed: its port refuses connections now
        refused = (await http.post("/reach", json=CALL)).json()
        assert refused["status"] == "NO_AVAILABLE_HANDLER"
        # The positive control: the refusal did open the breaker.
        assert (await http.get("/admin/agents/restarter")).json()["circuit"] == "open"
        new = await FakeAgent("restarter", port=old.port).start()
        try:
            await new.register(server.url, vectors=False)  # the same endpoint: a takeover
            row = (await http.get("/admin/agents/restarter")).json()
            assert row["circuit"] == "closed" and row["stats"]["requests"] == 0
            answer = (await http.post("/reach", json=CALL)).json()
            assert answer["status"] == "SUCCESS", answer
            assert answer["handlerAgentId"] == "restarter"
        finally:
            await new.stop()
