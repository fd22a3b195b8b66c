"""A call every candidate answered busy (429) waits the Retry-After on the Router's clock.

In process: a FakeTransport and a ManualClock. The busy wait (dispatch/busy.py) and the slot it
holds at the busy agent meanwhile sleep on the Router's clock, so the test moves time past the
Retry-After by hand; nothing waits for real. Before, both slept on the event loop's own time:
the wait ran its 2 s and more for real whatever the clock said.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from reachmesh.config import RouterConfig
from reachmesh.protocol import AgentProfile
from reachmesh.server.components import RouterParts
from reachmesh.testing import Answer, FakeTransport, ManualClock
from reachmesh.transport.fake import BUSY_RETRY_AFTER, FakeEndpoint
from tests.helpers import scaled, until


async def busy_agent(parts: RouterParts, fake: FakeTransport, **profile: Any) -> FakeEndpoint:
    url = "http://a.test:80/reach"
    body = {"id": "a", "network": {"endpoint": url}, "capabilities": [{"task": "echo"}], **profile}
    await parts.registry.register(AgentProfile.model_validate(body))
    return fake.endpoint(url, default=Answer({"ok": True})).then("busy")


async def test_a_busy_wait_and_its_held_slot_run_on_the_routers_clock() -> None:
    clock = ManualClock()
    fake = FakeTransport(clock)
    config = RouterConfig.model_validate({"embedding": {"backend": "none"}})
    parts = RouterParts.build(config, transport=fake, clock=clock)
    agent = await busy_agent(parts, fake, max_concurrency=1)
    envelope = {"targetTask": "echo", "preferences": {"timeoutMs": 30_000}}
    call = asyncio.ensure_future(parts.dispatcher.handle(orjson.dumps(envelope)))
    # The busy wait, and the slot held at the agent for as long: both asleep on the clock.
    await until(lambda: clock.sleeping == 2, "the busy wait and its held slot on the clock")
    assert len(agent.received) == 1 and not call.done()
    assert parts.capacity.inflight("a") == 1  # the held slot: the agent is full elsewhere
    retry_after = int(BUSY_RETRY_AFTER)
    clock.advance(retry_after * 1.25)  # the Retry-After and its largest spread
    status, body = await asyncio.wait_for(call, scaled(10))
    answer = orjson.loads(body)
    assert (status, answer["status"]) == (200, "SUCCESS"), answer
    assert [a["outcome"] for a in answer["attempts"]][-1] == "SUCCESS"
    assert len(agent.received) == 2
    await until(lambda: parts.capacity.inflight("a") == 0, "the held slot given back")


async def test_the_pause_before_a_same_agent_retry_runs_on_the_routers_clock() -> None:
    """``retries.backoff_ms`` before a retry of the same agent: asleep on the Router's clock,
    so the deadline it is cut to and the pause read one time (it slept on the loop's before)."""
    clock = ManualClock()
    fake = FakeTransport(clock)
    policy = {"embedding": {"backend": "none"}, "retries": {"same_agent": 1, "backoff_ms": 5_000}}
    parts = RouterParts.build(RouterConfig.model_validate(policy), transport=fake, clock=clock)
    url = "http://a.test:80/reach"
    body = {"id": "a", "network": {"endpoint": url}, "capabilities": [{"task": "echo"}]}
    await parts.registry.register(AgentProfile.model_validate(body))
    agent = fake.endpoint(url, default=Answer({"ok": True})).then("refused")
    envelope = {"targetTask": "echo", "preferences": {"timeoutMs": 30_000}}
    call = asyncio.ensure_future(parts.dispatcher.handle(orjson.dumps(envelope)))
    await until(lambda: clock.sleeping == 1, "the pause before the retry, on the clock")
    assert len(agent.received) == 1 and not call.done()  # the refused try, and no retry yet
    clock.advance(5 * 1.5)  # the pause and its largest jitter
    status, answer_body = await asyncio.wait_for(call, scaled(10))
    answer = orjson.loads(answer_body)
    assert (status, answer["status"]) == (200, "SUCCESS"), answer
    assert len(answer["attempts"]) == 2 and answer["attempts"][-1]["outcome"] == "SUCCESS", answer
    assert len(agent.received) == 2
