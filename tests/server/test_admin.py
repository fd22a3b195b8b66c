"""The registry API and admin endpoints of PROTOCOL.md §2 and §4."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import httpx
import pytest

from reachmesh.testing import FakeAgent, RouterServer

PROFILE = {
    "id": "price-query-agent",
    "display_name": "价格查询Agent",
    "network": {"protocol": "http", "endpoint": "http://127.0.0.1:9/reach"},
    "capabilities": [{"task": "query_product_price", "input_schema": {"product_id": "string"}}],
}
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


async def test_register_and_list(http: httpx.AsyncClient) -> None:
    """POST /agents answers 201 with a lease; the agent is listed as available with an ISO heartbeat."""
    resp = await http.post("/agents", json=PROFILE)
    assert resp.status_code == 201
    reg = resp.json()
    assert reg["agentId"] == "price-query-agent"
    assert reg["leaseId"].startswith("0x")
    assert reg["ttlSeconds"] == 60
    assert reg["status"] == "available"

    rows = (await http.get("/admin/agents")).json()
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "available"
    assert ISO.match(row["lastHeartbeat"])
    assert row["capabilities"] == ["query_product_price"]
    assert row["circuit"] == "closed"
    assert set(row["stats"]) == {"requests", "successRate", "p50LatencyMs", "inflight"}
    assert (await http.get("/admin/agents/price-query-agent")).json()["id"] == "price-query-agent"


async def test_unknown_agent_is_404(http: httpx.AsyncClient) -> None:
    """GET /admin/agents/{id} of an unknown id is a JSON 404."""
    resp = await http.get("/admin/agents/nobody")
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "AGENT_NOT_FOUND"


async def test_conflict_and_replace(http: httpx.AsyncClient) -> None:
    """A live id without its lease is 409; with the leaseId the profile is replaced in place."""
    lease = (await http.post("/agents", json=PROFILE)).json()["leaseId"]
    elsewhere = {**PROFILE, "network": {"protocol": "http", "endpoint": "http://127.0.0.1:10/reach"}}
    resp = await http.post("/agents", json=elsewhere)
    assert resp.status_code == 409
    assert resp.json()["error"]["code"] == "AGENT_ID_CONFLICT"
    new_profile = {**PROFILE, "capabilities": [{"task": "query_promotion"}], "leaseId": lease}
    resp = await http.post("/agents", json=new_profile)
    assert resp.status_code == 200
    assert resp.json()["leaseId"] == lease
    row = (await http.get("/admin/agents/price-query-agent")).json()
    assert row["capabilities"] == ["query_promotion"]


async def test_a_retried_registration_gets_its_lease_back(http: httpx.AsyncClient) -> None:
    """Same instanceId and endpoint: 200 with the same lease; another endpoint: still 409."""
    mine = {**PROFILE, "instanceId": "instance-token-aaaa"}
    first = await http.post("/agents", json=mine)
    assert first.status_code == 201
    again = await http.post("/agents", json=mine)
    assert again.status_code == 200
    assert again.json()["leaseId"] == first.json()["leaseId"]
    moved = {**mine, "network": {"protocol": "http", "endpoint": "http://127.0.0.1:10/reach"}}
    theirs = await http.post("/agents", json={**moved, "instanceId": "instance-token-bbbb"})
    assert theirs.status_code == 409
    assert theirs.json()["error"]["code"] == "AGENT_ID_CONFLICT"
    assert (await http.post("/agents", json=moved)).status_code == 409


async def test_a_restarted_instance_takes_its_id_over_at_once(http: httpx.AsyncClient) -> None:
    """Another instanceId at the holder's endpoint: 201 with a new lease; the old lease is refused."""
    old = await http.post("/agents", json={**PROFILE, "instanceId": "instance-token-killed"})
    new = await http.post("/agents", json={**PROFILE, "instanceId": "instance-token-restarted"})
    assert (old.status_code, new.status_code) == (201, 201)
    assert new.json()["leaseId"] != old.json()["leaseId"]
    renewed = await http.put("/agents/price-query-agent/lease", json={"leaseId": old.json()["leaseId"]})
    assert renewed.status_code == 403
    renewed = await http.put("/agents/price-query-agent/lease", json={"leaseId": new.json()["leaseId"]})
    assert renewed.status_code == 200


async def test_a_bad_instance_id_is_refused_without_echoing_it(http: httpx.AsyncClient) -> None:
    """A non-string or oversized instanceId is 422 INVALID_PROFILE, and the answer does not repeat it."""
    for bad in (12345, "", "x" * 257):
        resp = await http.post("/agents", json={**PROFILE, "instanceId": bad})
        assert resp.status_code == 422, bad
        assert resp.json()["error"]["code"] == "INVALID_PROFILE"
        assert "x" * 257 not in resp.text


async def test_lease_renewal_and_deregistration(http: httpx.AsyncClient) -> None:
    """PUT renews (200); a foreign lease is 403; DELETE with the header removes the agent (204)."""
    lease = (await http.post("/agents", json=PROFILE)).json()["leaseId"]
    resp = await http.put("/agents/price-query-agent/lease", json={"leaseId": lease})
    assert resp.status_code == 200
    assert resp.json() == {"agentId": "price-query-agent", "leaseId": lease, "ttlSeconds": 60}
    resp = await http.put("/agents/price-query-agent/lease", json={"leaseId": "0xnope"})
    assert resp.status_code == 403
    resp = await http.request("DELETE", "/agents/price-query-agent", json={"leaseId": "0xnope"})
    assert resp.status_code == 403
    resp = await http.delete("/agents/price-query-agent", headers={"X-Reach-Lease": lease})
    assert resp.status_code == 204
    assert (await http.get("/admin/agents")).json() == []
    resp = await http.put("/agents/price-query-agent/lease", json={"leaseId": lease})
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "LEASE_NOT_FOUND"


async def test_delete_with_body(http: httpx.AsyncClient) -> None:
    """DELETE accepts the lease in the body too."""
    lease = (await http.post("/agents", json=PROFILE)).json()["leaseId"]
    resp = await http.request("DELETE", "/agents/price-query-agent", json={"leaseId": lease})
    assert resp.status_code == 204


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({**PROFILE, "id": "UPPER"}, {"id"}),
        ({**PROFILE, "network": {"endpoint": "not a url"}}, {"network.endpoint"}),
        ({k: v for k, v in PROFILE.items() if k != "capabilities"}, {"capabilities"}),
        (
            {**PROFILE, "capabilities": [{"task": "t", "input_schema": {"a": "str"}}]},
            {"capabilities.0.input_schema"},
        ),
        ([1, 2], {"(body)"}),
    ],
)
async def test_invalid_profile_is_422_with_field_paths(http: httpx.AsyncClient, body, fields) -> None:
    """An invalid profile is 422 INVALID_PROFILE listing the field paths at fault."""
    resp = await http.post("/agents", json=body)
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["code"] == "INVALID_PROFILE"
    assert {d["field"] for d in error["details"]} == fields


async def test_registry_refuses_non_json(http: httpx.AsyncClient) -> None:
    """Non-JSON bodies and wrong content types on registry calls are structured 4xx errors."""
    resp = await http.post("/agents", content=b"{oops", headers={"Content-Type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "INVALID_REQUEST"
    resp = await http.post("/agents", content=b"id=x", headers={"Content-Type": "text/plain"})
    assert resp.status_code == 415
    resp = await http.put("/agents/x/lease", json={})
    assert resp.status_code == 400


async def test_unknown_path_and_method_are_json(http: httpx.AsyncClient) -> None:
    """Unknown paths and methods answer JSON errors, not HTML."""
    resp = await http.get("/nowhere")
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "NOT_FOUND"
    resp = await http.delete("/admin/agents")
    assert resp.status_code == 405
    assert resp.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert "GET" in resp.headers["allow"]  # RFC 9110: a 405 says which methods the path takes
    resp = await http.post("/admin/ui")
    assert resp.status_code == 405
    assert "GET" in resp.headers["allow"]


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_reach_with_another_method_is_405(http: httpx.AsyncClient, method: str) -> None:
    """/reach is a known path: any method but POST is 405 naming POST in Allow, as for every
    other endpoint (protocol §10), not 404 (which says the Router has no /reach at all)."""
    resp = await http.request(method, "/reach")
    assert resp.status_code == 405
    assert resp.json()["error"]["code"] == "METHOD_NOT_ALLOWED"
    assert resp.headers["allow"] == "POST"


async def test_health_ready_and_openapi(http: httpx.AsyncClient) -> None:
    """/healthz and /readyz answer 200; /openapi.json documents every endpoint."""
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    assert (await http.get("/readyz")).status_code == 200
    doc = (await http.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    for path, method in [
        ("/reach", "post"),
        ("/agents", "post"),
        ("/agents/{agent_id}/lease", "put"),
        ("/agents/{agent_id}", "delete"),
        ("/admin/agents", "get"),
        ("/admin/agents/{agent_id}", "get"),
        ("/healthz", "get"),
    ]:
        assert method in doc["paths"][path]
    refs = re.findall(r'"\$ref": ?"#/components/schemas/(\w+)"', resp_text(doc))
    assert set(refs) <= set(doc["components"]["schemas"])


def resp_text(doc: dict) -> str:
    import json

    return json.dumps(doc)


async def test_a_trace_filter_by_an_unknown_status_is_a_400_naming_it(
    http: httpx.AsyncClient, make_agent
) -> None:
    """?status=BOGUS is 400 INVALID_REQUEST with the statuses there are; a known one filters, in any case."""
    await make_agent("echo-agent", tasks=("echo",))
    assert (await http.post("/reach", json={"targetTask": "echo", "payload": {}})).json()[
        "status"
    ] == "SUCCESS"
    bad = await http.get("/admin/traces", params={"status": "BOGUS"})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert error["code"] == "INVALID_REQUEST" and error["details"][0]["field"] == "status"
    assert "SUCCESS" in error["message"] and "'BOGUS'" in error["message"]
    near = (await http.get("/admin/traces", params={"status": "SUCESS"})).json()["error"]["message"]
    assert "did you mean 'SUCCESS'?" in near
    for spelled in ("SUCCESS", "success"):
        rows = (await http.get("/admin/traces", params={"status": spelled})).json()
        assert len(rows) == 1 and rows[0]["status"] == "SUCCESS"
    assert (await http.get("/admin/traces", params={"status": "TIMEOUT"})).json() == []


async def test_an_unknown_trace_at_a_worker_says_the_other_workers_keep_theirs(
    router: RouterServer, http: httpx.AsyncClient
) -> None:
    """Under `reach router --workers N` each worker keeps only the traces of the calls it served,
    and a new connection may reach any of them: its 404 says which worker answered, so a trace
    the other worker holds does not read as lost."""
    assert "worker" not in (await http.get("/admin/traces/elsewhere")).json()["error"]["message"]
    router.app.parts.worker = 1
    resp = await http.get("/admin/traces/elsewhere")
    assert resp.status_code == 404
    message = resp.json()["error"]["message"]
    assert "worker 1" in message and "traces of the calls it served" in message


async def test_a_trace_chained_without_end_by_its_caller_still_answers(
    http: httpx.AsyncClient, make_agent: Callable[..., Awaitable[FakeAgent]]
) -> None:
    """A caller that names the span its agent was sent as the parent of its next call nests one
    traceId's hops as deep as it likes (X-Reach-Hops does not see it): 130 such calls once made
    GET /admin/traces/{traceId} a bare 500, orjson's recursion limit passed."""
    agent = await make_agent("chained")
    parent: str | None = None
    for _ in range(130):
        headers = {"traceparent": parent} if parent else {}
        body = {"targetTask": "echo", "payload": {}, "traceId": "chained-trace"}
        assert (await http.post("/reach", json=body, headers=headers)).status_code == 200
        parent = agent.headers[-1]["traceparent"]
    resp = await http.get("/admin/traces/chained-trace")
    assert resp.status_code == 200
    trace = resp.json()
    assert len(trace["hops"]) == 130
    assert sum(1 for hop in trace["hops"] if "parentHop" not in hop) == 5  # 130 hops, 32 to a level
