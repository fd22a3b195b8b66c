"""The series a `/metrics` scrape renders are bounded, whatever the registry holds.

A scrape is rendered on the Router's event loop, about 13 µs a line. The series followed the
registry alone, and one agent token may hold 1000 agents of 64 tasks each: 64,000 tasks called
once made a 69 MB scrape that held the Router 15 s, and Prometheus scrapes every 15 s. Now the
`task` label takes at most `metrics.max_tasks` values (500) besides `_unknown` and `_other`, and
`reach_requests_total` at most `metrics.max_request_series` label sets (5000); past them a
request counts under `_other`.
"""

from __future__ import annotations

import re

import orjson

from reachmesh.config import RouterConfig
from reachmesh.protocol import AgentProfile
from reachmesh.server.components import RouterParts
from reachmesh.testing import Answer, FakeTransport, ManualClock
from tests.helpers import until

AGENTS, TASKS_EACH = 10, 64  # 640 tasks, more than the default bound of 500


async def router_with_many_tasks(policy: dict[str, object]) -> tuple[RouterParts, list[str]]:
    clock = ManualClock()
    fake = FakeTransport(clock)
    config = RouterConfig.model_validate({"embedding": {"backend": "none"}, **policy})
    parts = RouterParts.build(config, transport=fake, clock=clock)
    tasks: list[str] = []
    for i in range(AGENTS):
        url = f"http://a{i}.test:80/reach"
        mine = [f"task-{i}-{j}" for j in range(TASKS_EACH)]
        tasks += mine
        body = {"id": f"a{i}", "network": {"endpoint": url}, "capabilities": [{"task": t} for t in mine]}
        await parts.registry.register(AgentProfile.model_validate(body))
        fake.endpoint(url, default=Answer({"ok": True}))
    return parts, tasks


def task_labels(exposition: str) -> set[str]:
    return set(re.findall(r'reach_end_to_end_latency_seconds_count\{task="([^"]*)"\}', exposition))


def scrape_with_other(parts: RouterParts) -> str | None:
    """The exposition, once the last requests are counted and some under ``_other``."""
    text: str = parts.metrics.exposition().decode()
    return text if '"_other"' in text else None


async def call_each(parts: RouterParts, tasks: list[str]) -> None:
    for task in tasks:
        status, body = await parts.dispatcher.handle(orjson.dumps({"targetTask": task}))
        assert status == 200, body


async def test_a_scrape_names_at_most_max_tasks_tasks() -> None:
    parts, tasks = await router_with_many_tasks({})
    await call_each(parts, tasks)
    exposition: str = await until(lambda: scrape_with_other(parts), "requests counted under _other")
    labels = task_labels(exposition)
    assert len(labels - {"_other", "_unknown"}) == 500, len(labels)  # before: all 640
    assert "_other" in labels
    total = sum(float(v) for v in re.findall(r"^reach_requests_total\{[^}]*\} (\S+)$", exposition, re.M))
    assert total == len(tasks)  # every request counted, under its task or under _other


async def test_request_series_past_their_bound_count_under_other() -> None:
    parts, tasks = await router_with_many_tasks({"metrics": {"max_tasks": 1000, "max_request_series": 100}})
    await call_each(parts, tasks)
    exposition: str = await until(lambda: scrape_with_other(parts), "requests counted under _other")
    series = re.findall(r"^reach_requests_total\{([^}]*)\} (\S+)$", exposition, re.M)
    assert len(series) == 101, len(series)  # 100, and the one of _other for SUCCESS
    other = [float(v) for labels, v in series if 'task="_other"' in labels]
    assert other == [len(tasks) - 100]
    assert 'agent="_other"' in exposition


async def test_an_agent_registering_again_keeps_the_overflow_counts() -> None:
    """A registration in place drops the series of tasks no agent declares any more: `_other` is
    declared by none, and its counts (Prometheus's counters) must not be reset by it."""
    parts, tasks = await router_with_many_tasks({})
    await call_each(parts, tasks)
    before: str = await until(lambda: scrape_with_other(parts), "requests counted under _other")
    counted = _other_requests(before)
    assert counted > 0
    again = {
        "id": "a0",
        "network": {"endpoint": "http://a0.test:80/reach"},
        "capabilities": [{"task": "task-0-0"}],
    }
    await parts.registry.register(AgentProfile.model_validate(again))  # in place: REPLACED
    assert _other_requests(parts.metrics.exposition().decode()) == counted


def _other_requests(exposition: str) -> float:
    found = re.findall(r'^reach_requests_total\{[^}]*task="_other"[^}]*\} (\S+)$', exposition, re.M)
    return sum(float(v) for v in found)
