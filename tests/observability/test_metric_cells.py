"""The metrics work out a request's labels once per task, agent and status, and keep them: a
registry change in between must still label the next request as the registry stands then."""

from __future__ import annotations

import asyncio

from reachmesh.config import RegistryPolicy
from reachmesh.decision import AttemptRecord, DecisionRecord
from reachmesh.observability.metrics import LiveReadings, RouterMetrics
from reachmesh.protocol import AgentProfile, Status
from reachmesh.registry.memory import MemoryRegistry


def _record(task: str, agent: str, status: Status = Status.SUCCESS) -> DecisionRecord:
    record = DecisionRecord(trace_id="t", task=task, source="targetTask", started=1.0)
    record.matched_task, record.handler, record.status = task, agent, status
    record.attempts.append(AttemptRecord(agent, "SUCCESS", 1.0))
    record.duration_ms = 3.0
    return record


def _profile(agent_id: str, task: str) -> AgentProfile:
    return AgentProfile.model_validate(
        {
            "id": agent_id,
            "network": {"endpoint": f"http://127.0.0.1:9/{agent_id}"},
            "capabilities": [{"task": task}],
        }
    )


def test_each_request_is_labelled_as_the_registry_stands_when_it_is_counted() -> None:
    async def run() -> list[dict[tuple[str, ...], float]]:
        registry = MemoryRegistry(RegistryPolicy())
        first, _ = await registry.register(_profile("a1", "echo"))
        metrics = RouterMetrics(registry, LiveReadings(lambda _a: 0, lambda _a: 0, lambda: 0))
        registry.subscribe(metrics.on_registry)  # as the Router's composition root does
        seen = []
        metrics(_record("echo", "a2"))  # a2 is not registered: no agent
        second, _ = await registry.register(_profile("a2", "echo"))
        metrics(_record("echo", "a2"))  # now it is
        metrics.observe_all([_record("echo", "a2"), _record("echo", "a1")], _never)
        seen.append(dict(metrics.requests.values))
        await registry.deregister("a2", second.lease_id)
        metrics(_record("echo", "a2"))  # gone again, and its series with it
        seen.append(dict(metrics.requests.values))
        await registry.deregister("a1", first.lease_id)
        metrics.observe_all([_record("echo", "a1")], _never)  # echo's last agent left: no known task
        await registry.register(_profile("a3", "echo"))
        metrics(_record("echo", "a3"))  # echo is back, in series made anew
        seen.append(dict(metrics.requests.values))
        seen.append({labels: row[-1] for labels, row in metrics.latency.series.items()})
        return seen

    ok = ("SUCCESS",)
    assert asyncio.run(run()) == [
        {("echo", "_none", *ok): 1.0, ("echo", "a2", *ok): 2.0, ("echo", "a1", *ok): 1.0},
        {("echo", "_none", *ok): 2.0, ("echo", "a1", *ok): 1.0},
        {("_unknown", "_none", *ok): 1.0, ("echo", "a3", *ok): 1.0},
        {("_unknown",): 0.003, ("echo",): 0.003},
    ]


def _never(observer: object) -> None:
    raise AssertionError(f"{observer!r} failed")
