"""Metrics, traces and JSON logs after a drill with a failing agent, a retry and a failover."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import string
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reachmesh.config import RouterConfig
from reachmesh.observability.logging import JsonFormatter
from reachmesh.sdk import AgentConfig, ReachAgent, ReachContext
from reachmesh.testing import FakeAgent, RouterServer, free_port
from reachmesh.tracecontext import w3c_trace_id


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus exposition, parsed by prometheus_client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(parsed: dict, name: str, **labels: str) -> float:
    return float(parsed.get((name, frozenset(labels.items())), 0.0))


async def test_drill_metrics_trace_and_json_logs(caplog: pytest.LogCaptureFixture) -> None:
    """A retry and a failover show in /metrics with exact counts, in the trace in order, and in JSON logs."""
    caplog.set_level(logging.INFO, logger="reachmesh.trace")
    config = RouterConfig.from_mapping({"health": {"enabled": False}})
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url) as http:
        dead = await FakeAgent("dead", weight=10).start()
        steady = await FakeAgent("steady", weight=1).start()
        await dead.register(server.url)
        await steady.register(server.url)
        await dead.stop()  # refused from now on

        first = (await http.post("/reach", json={"traceId": "drill-1", "targetTask": "echo"})).json()
        second = (await http.post("/reach", json={"traceId": "drill-2", "targetTask": "echo"})).json()
        unknown = (await http.post("/reach", json={"traceId": "drill-3", "targetTask": "no_such"})).json()
        assert first["status"] == second["status"] == "SUCCESS"
        assert unknown["status"] == "NO_AVAILABLE_HANDLER"

        parsed = samples((await http.get("/metrics")).text)
        assert value(parsed, "reach_requests_total", task="echo", agent="steady", status="SUCCESS") == 2
        assert (
            value(
                parsed, "reach_requests_total", task="_unknown", agent="_none", status="NO_AVAILABLE_HANDLER"
            )
            == 1
        )
        assert value(parsed, "reach_retries_total", reason="connect_error") == 1
        assert value(parsed, "reach_failovers_total", reason="connect_error") == 1
        assert value(parsed, "reach_agent_circuit_trips_total", agent="dead") == 1
        assert value(parsed, "reach_upstream_attempts_total", outcome="connect_error") == 2
        assert value(parsed, "reach_upstream_attempts_total", outcome="SUCCESS") == 2
        assert value(parsed, "reach_end_to_end_latency_seconds_count", task="echo") == 2
        assert value(parsed, "reach_agent_circuit_state", agent="dead") == 2
        assert value(parsed, "reach_registry_agents", status="available") == 2

        trace = (await http.get("/admin/traces/drill-1")).json()
        hop = trace["hops"][0]
        assert [(a["agentId"], a["outcome"]) for a in hop["attempts"]] == [
            ("dead", "connect_error"),
            ("dead", "connect_error"),
            ("steady", "SUCCESS"),
        ]
        kinds = [e["kind"] for e in hop["events"]]
        assert kinds == ["forward", "circuit open", "retry", "forward", "failover", "forward"]
        assert hop["decision"]["candidates"] == ["dead", "steady"]
        assert hop["decision"]["rejected"] == [{"agentId": "dead", "reason": "connect_error"}]
        assert hop["retries"] == ["connect_error"] and hop["failovers"] == ["connect_error"]
        second_hop = (await http.get("/admin/traces/drill-2")).json()["hops"][0]
        assert second_hop["decision"]["rejected"] == [{"agentId": "dead", "reason": "circuit_open"}]

        listed = (await http.get("/admin/traces", params={"status": "SUCCESS", "limit": 10})).json()
        assert [t["traceId"] for t in listed] == ["drill-2", "drill-1"]
        assert (await http.get("/admin/traces", params={"limit": "zero"})).status_code == 400
        assert (await http.get("/admin/traces/nope")).status_code == 404
        await steady.stop()

    formatter = JsonFormatter()
    lines = [
        json.loads(text)
        for r in caplog.records
        if r.name == "reachmesh.trace"
        for text in formatter.format(r).split("\n")
    ]
    mine = [line for line in lines if "drill-1" in line["message"]]
    assert len(mine) >= 7
    for line in mine:
        assert line["traceId"] == "drill-1"
        assert line["task"] == "echo"
        assert line["event"]
        assert "agent" in line
    forwards = [line for line in mine if line["event"] == "forward"]
    assert all(isinstance(line["durationMs"], float) for line in forwards)
    assert mine[-1]["event"] == "done" and mine[-1]["durationMs"] > 0


async def test_three_hops_make_one_trace_tree() -> None:
    """caller -> A -> B -> C: one traceId, one W3C trace id everywhere, and the hops nest as a tree."""
    config = RouterConfig.from_mapping({"health": {"enabled": False}})
    async with RouterServer(config) as server, httpx.AsyncClient(base_url=server.url) as http:
        leaf = await FakeAgent("agent-c", tasks=("step_c",)).start()
        await leaf.register(server.url)
        agents = []
        for name, task, calls in (("agent-a", "step_a", "step_b"), ("agent-b", "step_b", "step_c")):
            agent = ReachAgent(
                AgentConfig.from_mapping(
                    {
                        "agent": {
                            "id": name,
                            "network": {"endpoint": f"http://127.0.0.1:{free_port()}/reach"},
                            "capabilities": [{"task": task}],
                        },
                        "router": {"url": server.url},
                    },
                    env={},
                )
            )

            def bind(agent: ReachAgent = agent, task: str = task, calls: str = calls) -> None:
                @agent.capability(task)
                async def handle(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
                    inner = await ctx.call(calls, {"from": task})
                    return {"via": task, "inner": inner.result}

            bind()
            await agent.start()
            agents.append(agent)
        try:
            body = (await http.post("/reach", json={"targetTask": "step_a", "sourceAgent": "caller"})).json()
            assert body["status"] == "SUCCESS"
            assert body["result"]["inner"]["inner"]["agent"] == "agent-c"
            trace_id = body["traceId"]
            w3c = w3c_trace_id(trace_id)
            assert leaf.headers[-1]["traceparent"].split("-")[1] == w3c
            assert leaf.received[-1]["traceId"] == trace_id
            trace = (await http.get(f"/admin/traces/{trace_id}")).json()
            assert [h["task"] for h in trace["hops"]] == ["step_a", "step_b", "step_c"]
            assert [h["source"] for h in trace["hops"]] == ["caller", "agent-a", "agent-b"]
            tree = trace["tree"]
            assert len(tree) == 1 and tree[0]["task"] == "step_a"
            assert tree[0]["children"][0]["task"] == "step_b"
            assert tree[0]["children"][0]["children"][0]["task"] == "step_c"
            # Each hop's parent span is the attempt span of the hop above it.
            hops = trace["hops"]
            assert hops[1]["parentSpanId"] == hops[0]["attempts"][0]["spanId"]
            assert hops[2]["parentSpanId"] == hops[1]["attempts"][0]["spanId"]
        finally:
            for agent in agents:
                await agent.stop()
            await leaf.stop()


async def test_unknown_task_names_add_no_series() -> None:
    """10,000 requests with random unknown task names add no series beyond a fixed bound."""
    config = RouterConfig.from_mapping({"health": {"enabled": False}, "tracing": {"store_size": 100}})
    async with RouterServer(config) as server:
        agent = await FakeAgent("a").start()
        await agent.register(server.url)
        dispatcher = server.app.parts.dispatcher
        await dispatcher.handle(orjson.dumps({"targetTask": "echo"}))
        await dispatcher.handle(orjson.dumps({"targetTask": "warm-up-unknown"}))
        before = len(samples(server.app.parts.metrics.exposition().decode()))
        rng = random.Random(7)
        for _ in range(10_000):
            name = "".join(rng.choices(string.ascii_letters, k=12))
            status, _ = await dispatcher.handle(orjson.dumps({"targetTask": name, "payload": {}}))
            assert status == 503
        after = samples(server.app.parts.metrics.exposition().decode())
        print(f"\nseries before {before}, after 10,000 unknown tasks {len(after)}")
        assert len(after) == before
        assert len(server.app.parts.traces) == 100
        labels = {dict(k[1]).get("task") for k in after if k[0] == "reach_requests_total"}
        assert labels == {"echo", "_unknown"}
        await agent.stop()
        await asyncio.sleep(0)


def test_match_score_buckets_resolve_scores_by_meaning_and_exact_ones() -> None:
    """Each model's calibrated threshold sits between bounds at most 0.025 apart, several bounds
    cover 0.05-0.2 where routes by meaning score, and an exact route (1.0) has a bucket alone."""
    from reachmesh.observability.metrics import _SCORE_BUCKETS
    from reachmesh.semantic.embedders.base import CALIBRATED

    bounds = sorted(_SCORE_BUCKETS)
    for threshold, _margin in CALIBRATED.values():
        below = max(b for b in bounds if b <= threshold)
        above = min(b for b in bounds if b > threshold)
        assert above - below <= 0.025 + 1e-9, (threshold, below, above)
    assert len([b for b in bounds if 0.05 <= b <= 0.2]) >= 6
    assert bounds[-1] == 1.0 and bounds[-2] < 1.0
