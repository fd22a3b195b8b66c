"""An input_schema mismatch lists a bounded number of faults and counts the rest; a payload of
hundreds of thousands of faults costs the Router a bounded refusal, not a stalled event loop."""

from __future__ import annotations

import asyncio

import httpx
import orjson

from reachmesh.config import RouterConfig
from reachmesh.schema import SCAN_NODES, PayloadValidator
from reachmesh.testing import FakeAgent, RouterServer

STRINGS = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}}


def config(**limits: int) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "limits": {"loop_lag_ms": 10_000, **limits},
        }
    )


async def test_a_payload_with_thousands_of_faults_lists_twenty_and_counts_the_rest() -> None:
    """4,000 wrong items (every fault is counted at that size): 20 details, detailsOmitted 3,980,
    the message names the 20 and the count, the answer stays under 4 KB; and a smaller
    limits.max_error_details is kept to."""
    async with RouterServer(config()) as router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        agent = FakeAgent("strict", tasks=("strict",), input_schema=STRINGS)
        await agent.start()
        try:
            await agent.register(router.url, vectors=False)
            resp = await http.post("/reach", json={"targetTask": "strict", "payload": {"items": [1] * 4000}})
            error = resp.json()["error"]
            assert (resp.status_code, resp.json()["status"]) == (400, "INVALID_REQUEST")
            assert len(error["details"]) == 20 and error["detailsOmitted"] == 3980
            assert error["details"][0] == {"field": "payload.items.0", "message": '1 is not of type "string"'}
            assert "payload.items.19 and 3980 more" in error["message"]
            assert len(resp.content) < 4096, len(resp.content)
            assert agent.received == []
        finally:
            await agent.stop()
    async with (
        RouterServer(config(max_error_details=3)) as router,
        httpx.AsyncClient(base_url=router.url) as http,
    ):
        agent = FakeAgent("strict", tasks=("strict",), input_schema=STRINGS)
        await agent.start()
        try:
            await agent.register(router.url, vectors=False)
            resp = await http.post(
                "/reach", json={"targetTask": "strict", "payload": {"items": [1, 2, 3, 4]}}
            )
            error = resp.json()["error"]
            assert len(error["details"]) == 3 and error["detailsOmitted"] == 1
        finally:
            await agent.stop()


async def test_a_megabyte_of_faults_is_one_small_answer_and_healthz_is_served() -> None:
    """A 1 MB body of 340,000 wrong items, sent beside /healthz probes: the answer names the first
    fault and says the rest were not listed (no detailsOmitted: they were not counted), it stays
    under 2 KB, and every probe is answered. (Before, the answer was 340,000 details, 32 MB, and
    the loop stalled for seconds: bench/error_details.py measures the stall.)"""
    big = orjson.dumps({"targetTask": "strict", "payload": {"items": [1] * 340_000}})
    assert len(big) < 1024 * 1024
    async with RouterServer(config()) as router, httpx.AsyncClient(base_url=router.url, timeout=60) as http:
        agent = FakeAgent("strict", tasks=("strict",), input_schema=STRINGS)
        await agent.start()
        try:
            await agent.register(router.url, vectors=False)
            headers = {"Content-Type": "application/json"}
            call = asyncio.create_task(http.post("/reach", content=big, headers=headers))
            probes = 0
            while not call.done():
                assert (await http.get("/healthz")).status_code == 200
                probes += 1
            resp = await call
            error = resp.json()["error"]
            assert resp.json()["status"] == "INVALID_REQUEST"
            assert error["details"] == [{"field": "payload.items.0", "message": '1 is not of type "string"'}]
            assert "detailsOmitted" not in error
            assert "too large to list them all" in error["message"]
            assert len(resp.content) < 2048, len(resp.content)
            assert probes >= 1
        finally:
            await agent.stop()


def test_the_validator_counts_only_within_its_node_budget() -> None:
    """Bytes in, faults out: at the budget every fault is counted; one node past it, the first alone."""
    validator = PayloadValidator(STRINGS)
    under = validator.faults({"items": [1] * (SCAN_NODES - 2)}, 5)
    assert len(under.details) == 5 and under.omitted == SCAN_NODES - 7
    over = validator.faults({"items": [1] * (SCAN_NODES - 1)}, 5)
    assert len(over.details) == 1 and over.omitted is None
    assert validator.faults({"items": ["a"]}, 5) == ([], 0)
    required = PayloadValidator({"type": "object", "required": ["a/b", 'q"x']})
    fields = [d["field"] for d in required.faults({}, 5).details]
    assert fields == ["payload.a/b", 'payload.q"x']
