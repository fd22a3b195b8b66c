"""An async request that finishes while etcd is frozen: its result is written, and its job
dropped, once etcd answers again.

Before, a result whose write to etcd failed was "kept here only" for good: the job stayed in
etcd under the running Router's claim while that Router lived, so every other Router answered
its caller's `GET /reach/{traceId}` `202` (still running) until the result expired (and `404`
after), the job counted against `async_mode.etcd_max_pending` for ever, and when the Router
stopped, another adopted the finished request and ran it at the agent a second time.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.helpers import until

pytestmark = pytest.mark.etcd


async def test_a_result_etcd_could_not_take_is_written_when_etcd_answers_again(
    etcd: EtcdCluster, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reachmesh.async")
    hold = asyncio.Event()
    agent = await FakeAgent("settler", tasks=("hold",), hold=hold, result={"done": 1}).start()
    policy = etcd_policy(
        etcd,
        registry={"etcd": {"request_timeout_seconds": 1, "attempt_timeout_seconds": 0.5}},
        # The claim outlives the freeze: nobody adopts; what is tested is the result's own way.
        async_mode={"adopt_interval_seconds": 0.2, "claim_ttl_seconds": 30},
        health={"enabled": False},
    )
    try:
        async with RouterServer(policy) as a, RouterServer(policy) as b:
            await agent.register(a.url, vectors=False)
            body = {"targetTask": "hold", "preferences": {"mode": "async"}}
            accepted = await client.post(f"{a.url}/reach", json=body)
            assert accepted.status_code == 202
            trace_id = accepted.json()["traceId"]
            await until(lambda: agent.received, "the request held at the agent")
            journal = a.app.parts.dispatcher.async_requests.journal
            assert journal is not None

            etcd.members[0].freeze()
            try:
                hold.set()  # the agent answers; the result's write to etcd fails
                await until(
                    lambda: "could not be written to etcd" in caplog.text,
                    "the failed write of the result",
                    within=30,
                )
                assert (await client.get(f"{a.url}/reach/{trace_id}")).status_code == 200
            finally:
                etcd.members[0].thaw()

            async def read_at_b() -> bool:
                answer = await client.get(f"{b.url}/reach/{trace_id}")
                return answer.status_code == 200 and answer.json()["result"] == {"done": 1}

            await until(read_at_b, "the result readable at the other Router", within=30)

            async def job_dropped() -> bool:
                return await journal.job(trace_id) is None

            await until(job_dropped, "the finished job dropped from etcd", within=30)
        # Router A stopped (its claims released at once): nobody runs the request again.
        assert len(agent.received) == 1
    finally:
        await agent.stop()
