"""What one caller does stays its own: async slots, conversation affinity, traceIds in use."""

from __future__ import annotations

from typing import Any

import orjson

from reachmesh.config import RouterConfig
from reachmesh.protocol import AgentProfile
from reachmesh.server.components import RouterParts
from reachmesh.testing import FakeTransport, ManualClock

HOG = "hog-key"
FAIR = "fair-key"


class Rig:
    """A Router's parts over a fake transport; callers told apart by their principal's key."""

    def __init__(self, **policy: Any) -> None:
        self.clock = ManualClock()
        self.fake = FakeTransport(self.clock)
        config = RouterConfig.model_validate({"embedding": {"backend": "none"}, **policy})
        self.parts = RouterParts.build(config, transport=self.fake, clock=self.clock)

    async def agent(self, agent_id: str) -> None:
        url = f"http://{agent_id}.test:80/reach"
        profile = {"id": agent_id, "network": {"endpoint": url}, "capabilities": [{"task": "echo"}]}
        await self.parts.registry.register(AgentProfile.model_validate(profile))
        self.fake.endpoint(url)

    async def call(self, caller: str, **envelope: Any) -> tuple[int, dict[str, Any]]:
        status, body = await self.parts.dispatcher.handle(
            orjson.dumps({"targetTask": "echo", **envelope}), owner=caller, caller=caller
        )
        return status, orjson.loads(body)


async def test_one_caller_cannot_hold_every_async_slot() -> None:
    """8 async slots, 3 per client: the hog's fourth and fifth are 429 OVERLOADED naming the
    limit, and another caller's async request is still accepted (the hog held them all)."""
    rig = Rig(limits={"max_inflight": 8, "max_inflight_per_client": 3})
    await rig.agent("a")
    # Nothing yields between these calls, so none of the accepted requests has finished yet.
    statuses = [(await rig.call(HOG, preferences={"mode": "async"}))[0] for _ in range(5)]
    assert statuses == [202, 202, 202, 429, 429]
    status, answer = await rig.call(HOG, preferences={"mode": "async"})
    assert status == 429 and "limits.max_inflight_per_client" in answer["error"]["message"]
    status, answer = await rig.call(FAIR, preferences={"mode": "async"})
    assert (status, answer["status"]) == (202, "ACCEPTED")
    await rig.parts.dispatcher.drain(5)
    assert rig.parts.dispatcher.async_requests.running_for(HOG) == 0


async def test_another_callers_trace_id_in_use_is_not_visible() -> None:
    """The hog's async traceId: the same caller again gets TRACE_ID_IN_USE; another caller is
    accepted under a traceId of its own (it learned of the hog's request from the refusal)."""
    rig = Rig()
    await rig.agent("a")
    status, _ = await rig.call(HOG, traceId="shared-trace-1", preferences={"mode": "async"})
    assert status == 202
    status, answer = await rig.call(FAIR, traceId="shared-trace-1", preferences={"mode": "async"})
    assert (status, answer["status"]) == (202, "ACCEPTED")
    assert answer["traceId"] != "shared-trace-1"
    assert rig.parts.results.owner(answer["traceId"]) == FAIR
    assert rig.parts.results.owner("shared-trace-1") == HOG
    status, answer = await rig.call(HOG, traceId="shared-trace-1", preferences={"mode": "async"})
    assert (status, answer["error"]["code"]) == (400, "TRACE_ID_IN_USE")
    await rig.parts.dispatcher.drain(5)


async def test_conversation_affinity_is_keyed_by_caller_and_conversation() -> None:
    """The hog's conversation `c1` is bound to its agent; another caller sending `c1` is not
    routed by that binding, and does not move it."""
    rig = Rig()
    for agent_id in ("a", "b"):
        await rig.agent(agent_id)
    _, first = await rig.call(HOG, conversationId="c1", traceId="hog-1")
    held = first["handlerAgentId"]
    for i in range(4):
        _, answer = await rig.call(FAIR, conversationId="c1", traceId=f"fair-{i}")
        bound = affinity(rig, f"fair-{i}")
        # The fair caller's own binding from its first call on; never the hog's before.
        assert bound is None if i == 0 else bound == answer["handlerAgentId"]
    _, again = await rig.call(HOG, conversationId="c1", traceId="hog-2")
    assert affinity(rig, "hog-2") == held and again["handlerAgentId"] == held


def affinity(rig: Rig, trace_id: str) -> str | None:
    """The agent the conversation was bound to when the request was routed (the trace says)."""
    trace = rig.parts.traces.trace(trace_id)
    assert trace is not None
    bound: str | None = trace["hops"][0]["decision"]["affinity"]
    return bound
