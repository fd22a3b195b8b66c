"""Agent answers of any size arrive whole, up to the configured limit, at concurrency."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer

KB = 1024
MB = 1024 * 1024


def answer_of(size: int, seed: str) -> bytes:
    """A SUCCESS envelope of exactly ``size`` bytes whose result is a string of varied text."""
    head, tail = b'{"status":"SUCCESS","result":"', b'"}'
    filler = (seed * (size // max(len(seed), 1) + 1)).encode()[: size - len(head) - len(tail)]
    raw = head + filler + tail
    assert len(raw) == size
    return raw


async def call_many(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        body = {"targetTask": "echo", "preferences": {"timeoutMs": 20_000}}
        return list(await asyncio.gather(*(http.post("/reach", json=body) for _ in range(n))))


@pytest.mark.parametrize("size", [64 * KB, 1 * MB, 5 * MB])
@pytest.mark.parametrize("chunked", [False, True])
async def test_big_answers_arrive_byte_exact_at_concurrency(size: int, chunked: bool) -> None:
    """64 KB, 1 MB and 5 MB answers pass whole, ten at a time, and the breaker stays closed."""
    raw = answer_of(size, "价格 price 0123456789 ")
    expected = orjson.loads(raw)["result"]
    # 5 MB answers at concurrency 10 lag the loop on a busy machine: lag shedding is tested apart.
    async with RouterServer(RouterConfig.model_validate({"limits": {"loop_lag_ms": 10_000}})) as router:
        agent = await FakeAgent("big", raw_answer=raw, chunked=chunked).start()
        try:
            await agent.register(router.url)
            answers = await call_many(router.url, 10)
            for resp in answers:
                assert resp.status_code == 200, resp.text[:300]
                body = resp.json()
                assert body["status"] == "SUCCESS"
                assert body["result"] == expected
            assert router.app.parts.breakers.state("big").value == "closed"
            assert len(agent.received) == 10
        finally:
            await agent.stop()


@pytest.mark.parametrize("chunked", [False, True])
async def test_answer_limit_is_exact_and_not_the_agents_breaker(chunked: bool) -> None:
    """An answer at the limit passes; one byte over is AGENT_ERROR RESPONSE_TOO_LARGE, breaker closed."""
    limit = 256 * KB
    config = RouterConfig.model_validate(
        {
            "server": {"response_limit_bytes": limit},
            "breaker": {"failure_threshold": 2},
            "limits": {"loop_lag_ms": 10_000},
        }
    )
    async with RouterServer(config) as router:
        agent = await FakeAgent("edge", chunked=chunked).start()
        try:
            await agent.register(router.url)
            for size, ok in ((limit - 1, True), (limit, True), (limit + 1, False)):
                agent.raw_answer = answer_of(size, "abc")
                for resp in await call_many(router.url, 10):
                    body = resp.json()
                    if ok:
                        assert body["status"] == "SUCCESS", (size, body["error"])
                        assert len(body["result"]) == size - len(b'{"status":"SUCCESS","result":""}')
                    else:
                        assert resp.status_code == 502
                        assert body["status"] == "AGENT_ERROR"
                        assert body["error"]["code"] == "RESPONSE_TOO_LARGE"
                        assert str(limit) in body["error"]["message"]
                        # Refused by the agent's answer, not a failover candidate: one attempt.
                        assert [a["agentId"] for a in body["attempts"]] == ["edge"]
            # Ten oversized answers against a threshold of two: the agent is not sick.
            assert router.app.parts.breakers.state("edge").value == "closed"
        finally:
            await agent.stop()
