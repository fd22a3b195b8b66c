"""The capacity board says "queue full" with its own exception, and only that reads as full.

Found by a reviewer's probe: the attempt caught ``LookupError`` from the board, so a KeyError or an
IndexError of a bug inside it was answered as an agent whose line is full (the next candidate, then
OVERLOADED), hiding the bug. Real Router and agent on loopback.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.resilience import capacity
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled, until


async def test_a_bug_inside_the_capacity_board_is_an_internal_error_not_overloaded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    config = RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000},
            "timeouts": {"read_ms": 120_000},
        }
    )
    async with RouterServer(config) as router:
        release = asyncio.Event()
        agent = FakeAgent("bug-agent", tasks=("slow",), hold=release, max_concurrency=1)
        await agent.start()
        board = router.app.parts.capacity
        async with httpx.AsyncClient(base_url=router.url, timeout=scaled(60)) as http:
            try:
                assert (await http.post("/agents", json=agent.profile())).status_code == 201
                held = asyncio.create_task(
                    http.post("/reach", json={"targetTask": "slow", "preferences": {"timeoutMs": 120_000}})
                )
                await until(lambda: board.inflight("bug-agent") == 1, "the long call holds the slot")

                def broken_join(self: object, client: str, waiter: object) -> None:
                    raise KeyError(client)

                monkeypatch.setattr(capacity._Slots, "join", broken_join)
                resp = await http.post("/reach", json={"targetTask": "slow"})
                assert (resp.status_code, resp.json()["status"]) == (500, "INTERNAL_ERROR")
                assert any(
                    r.exc_info is not None and isinstance(r.exc_info[1], KeyError) for r in caplog.records
                ), "the board's bug is logged with its traceback"
                monkeypatch.undo()
                release.set()
                assert (await held).json()["status"] == "SUCCESS"
            finally:
                release.set()
                await agent.stop()
