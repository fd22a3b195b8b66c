"""A hostile caller against another caller's async results, on two Routers over one etcd.

Caller B knows (or guesses) caller A's traceId. At either Router, before and after A's request
finishes, B gets the `404` an id that never existed gets; B sending its own request under A's
traceId gets a fresh traceId, and A's result stays A's (docs/security.md, the async results row).
"""

from __future__ import annotations

import asyncio
import base64

import pytest

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.testing import FakeAgent, RouterServer
from tests.etcd.conftest import etcd_policy
from tests.etcd.test_async_shares import AGENT, caller, spec
from tests.helpers import scaled, until

pytestmark = pytest.mark.etcd

OWNER = "etcd-hostile-owner-token-0123456789"
PROBER = "etcd-hostile-prober-token-0123456789"
TRACE = "order-4711"  # a caller-chosen id: guessable


async def test_another_callers_async_result_is_unknown_to_a_hostile_caller_at_every_router(
    etcd: EtcdCluster,
) -> None:
    policy = etcd_policy(
        etcd,
        auth={"tokens": [spec(OWNER, "caller"), spec(PROBER, "caller"), spec(AGENT, "agent")]},
        health={"enabled": False},
        async_mode={"adopt_interval_seconds": 0.2},
    )
    hold = asyncio.Event()
    agent = await FakeAgent("hostile-echo", tasks=("echo",), hold=hold, result={"for": "owner"}).start()
    owner, prober = caller(OWNER), caller(PROBER)
    try:
        async with RouterServer(policy) as a, RouterServer(policy) as b:
            await agent.register(a.url, vectors=False, token=AGENT)
            # The owner's request is held at the agent across the prober's calls to both Routers
            # and etcd: its read timeout (3 s by default, not scaled) must not end it first on a
            # busy machine.
            held_ms = int(scaled(20_000))
            prefs = {"mode": "async", "timeoutMs": held_ms, "readTimeoutMs": held_ms}
            body = {"traceId": TRACE, "targetTask": "echo", "preferences": prefs}
            accepted = await owner.post(f"{a.url}/reach", json=body)
            assert accepted.status_code == 202 and accepted.json()["traceId"] == TRACE
            await until(lambda: agent.received, "the owner's request at the agent")

            async def unknown_to_the_prober() -> None:
                never = await prober.get(f"{a.url}/reach/never-sent-1")
                for router in (a, b):
                    probed = await prober.get(f"{router.url}/reach/{TRACE}")
                    assert probed.status_code == 404, probed.text
                    assert probed.json()["error"] == {
                        **never.json()["error"],
                        "message": never.json()["error"]["message"].replace("never-sent-1", TRACE),
                    }

            await unknown_to_the_prober()  # while it runs
            # The prober's own request under the owner's id: a fresh id, its own result.
            taken = await prober.post(f"{b.url}/reach", json={**body, "payload": {"x": 1}})
            assert taken.status_code == 202
            assert taken.json()["traceId"] != TRACE
            hold.set()

            async def finished_for_owner() -> bool:
                got = await owner.get(f"{b.url}/reach/{TRACE}")
                return got.status_code == 200 and got.json()["result"] == {"for": "owner"}

            await until(finished_for_owner, "the owner's result at the other Router")
            await unknown_to_the_prober()  # once finished, at both Routers
            mine = await prober.get(f"{b.url}/reach/{taken.json()['traceId']}")
            assert mine.status_code in (200, 202)
    finally:
        await owner.aclose()
        await prober.aclose()
        await agent.stop()


async def test_polling_an_id_that_does_not_exist_costs_etcd_one_read(
    etcd: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller polling ids it guesses makes the Router read etcd for each (no Router holds
    them): two reads each (the result, then the job); one now, both keys at one revision."""
    policy = etcd_policy(etcd, auth={"tokens": [spec(PROBER, "caller")]}, health={"enabled": False})
    prober = caller(PROBER)
    try:
        async with RouterServer(policy) as a:
            journal = a.app.parts.dispatcher.async_requests.journal
            assert journal is not None
            calls: list[str] = []
            real = journal.client.call

            guessed = {
                base64.b64encode((prefix + f"guess-{n}").encode()).decode()
                for n in range(5)
                for prefix in (journal.results, journal.jobs)
            }

            async def counted(path: str, body: dict[str, object], **kwargs: object) -> dict[str, object]:
                if any(key in str(body) for key in guessed):  # not the watch's, the ping's, the adopter's
                    calls.append(path)
                return await real(path, body, **kwargs)  # type: ignore[arg-type]

            monkeypatch.setattr(journal.client, "call", counted)
            for n in range(5):
                probed = await prober.get(f"{a.url}/reach/guess-{n}")
                assert probed.status_code == 404
            assert len(calls) == 5, calls
    finally:
        await prober.aclose()
