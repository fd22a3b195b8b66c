"""The A2A 1.0 specification's MUSTs that bind a gateway, checked against the Router's A2A face.

The A2A TCK is not on a package registry, so it cannot run in CI; these are its requirements as
our own tests. Each one quotes the line of the specification (docs/specification.md in
a2aproject/A2A) that it checks, with its section. Requests are written by hand on the wire, as
any client would send them, over both bindings where both apply.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a")

from reachmesh.config import RouterConfig
from reachmesh.integrations.a2a import A2AExport
from reachmesh.testing import FakeAgent, RouterServer, free_port

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}
V1 = {"A2A-Version": "1.0"}
# A2A §5.6.1: "Pattern: YYYY-MM-DDTHH:mm:ss.sssZ".
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """A client of a Router exporting A2A, with one echo agent behind it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router:  # type: ignore[arg-type]
        agent = await FakeAgent("echo-agent", tasks=("echo",)).start()
        try:
            await agent.register(router.url, vectors=False)
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                yield client
        finally:
            await agent.stop()


def message(**fields: Any) -> dict[str, Any]:
    """A user message for skill ``echo``; ``fields`` override (None removes one)."""
    body: dict[str, Any] = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"data": {"n": 1}}],
        "metadata": {"skill": "echo"},
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


async def rpc(
    http: httpx.AsyncClient, method: str, params: dict[str, Any], headers: dict[str, str] | None = V1
) -> dict[str, Any]:
    """One JSON-RPC call; the whole answer (``result`` or ``error``)."""
    body = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}
    resp = await http.post("/a2a/jsonrpc", json=body, headers=headers or {})
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    assert answer["id"] == body["id"]
    return answer


async def send_rpc(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    answer = await rpc(http, "SendMessage", {"message": message(**fields)})
    task: dict[str, Any] = answer["result"]["task"]
    return task


async def send_rest(http: httpx.AsyncClient) -> dict[str, Any]:
    resp = await http.post("/a2a/rest/message:send", json={"message": message()}, headers=V1)
    assert resp.status_code == 200, resp.text
    task: dict[str, Any] = resp.json()["task"]
    return task


# -- §3.3.2 validation: the proto's REQUIRED fields ------------------------------------------


@pytest.mark.parametrize("missing", ["messageId", "role"])
async def test_send_message_without_a_required_field_is_invalid_params(http, missing: str) -> None:
    """§3.3.2: "Servers MUST validate all input parameters before processing" (JSON-RPC
    ``-32602 Invalid params``, HTTP ``400``); a2a.proto marks Message.message_id and
    Message.role ``REQUIRED``. Nothing is routed for such a message, on either binding."""
    answer = await rpc(http, "SendMessage", {"message": message(**{missing: None})})
    assert "result" not in answer
    assert answer["error"]["code"] == -32602 and missing in answer["error"]["message"]
    wrong_role = await rpc(http, "SendMessage", {"message": message(role="ROLE_BOSS")})
    assert wrong_role["error"]["code"] == -32602
    resp = await http.post("/a2a/rest/message:send", json={"message": message(**{missing: None})}, headers=V1)
    assert resp.status_code == 400
    listed = await rpc(http, "ListTasks", {})
    assert listed["result"].get("tasks", []) == []


# -- §3.1.4 List Tasks ------------------------------------------------------------------------


async def test_list_tasks_is_newest_status_first_and_filters_by_status_time(http) -> None:
    """§3.1.4: "Implementations MUST return tasks sorted by their status timestamp time in
    descending order (most recently updated tasks first)"; ``statusTimestampAfter`` keeps the
    tasks updated at or after it. §5.6.1: timestamps "MUST be represented as ISO 8601
    formatted strings in UTC timezone". Tasks made by both paths (the Router's own JSON-RPC
    answer and a2a-sdk's handler behind HTTP+JSON) carry one."""
    before = datetime.now(UTC) - timedelta(minutes=1)
    made = [await send_rpc(http), await send_rest(http), await send_rpc(http), await send_rest(http)]
    stamps = [task["status"]["timestamp"] for task in made]
    assert all(ISO_MS.match(stamp) for stamp in stamps), stamps
    assert stamps == sorted(stamps) and len(set(stamps)) == 4
    newest_first = [task["id"] for task in reversed(made)]

    listed = (await rpc(http, "ListTasks", {}))["result"]
    assert [task["id"] for task in listed["tasks"]] == newest_first
    rest = (await http.get("/a2a/rest/tasks", headers=V1)).json()
    assert [task["id"] for task in rest["tasks"]] == newest_first

    since = before.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    recent = (await rpc(http, "ListTasks", {"statusTimestampAfter": since}))["result"]
    assert [task["id"] for task in recent["tasks"]] == newest_first
    later = (await rpc(http, "ListTasks", {"statusTimestampAfter": stamps[2]}))["result"]
    assert [task["id"] for task in later["tasks"]] == newest_first[:2]
    future = (datetime.now(UTC) + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    none = (await rpc(http, "ListTasks", {"statusTimestampAfter": future}))["result"]
    assert none.get("tasks", []) == []


async def test_list_tasks_pages_and_leaves_out_artifacts(http) -> None:
    """§3.1.4: "The nextPageToken field MUST always be present in the response. When there are
    no more results to retrieve ... the field MUST be set to an empty string"; "When
    includeArtifacts is false (the default), the artifacts field MUST be omitted entirely"."""
    made = [await send_rpc(http) for _ in range(3)]
    first = (await rpc(http, "ListTasks", {"pageSize": 2}))["result"]
    assert len(first["tasks"]) == 2 and first["nextPageToken"]
    assert all("artifacts" not in task for task in first["tasks"])
    rest = (await rpc(http, "ListTasks", {"pageSize": 2, "pageToken": first["nextPageToken"]}))["result"]
    assert rest["nextPageToken"] == ""
    seen = [task["id"] for task in first["tasks"] + rest["tasks"]]
    assert seen == [task["id"] for task in reversed(made)]
    full = (await rpc(http, "ListTasks", {"includeArtifacts": True}))["result"]
    assert all(task["artifacts"] for task in full["tasks"])


async def test_list_tasks_with_an_unknown_status_is_invalid_params(http) -> None:
    """§3.3.2: "Servers MUST validate all input parameters before processing" (JSON-RPC
    ``-32602``, HTTP ``400``): a ``status`` that is no TaskState is refused, not ignored."""
    await send_rpc(http)
    answer = await rpc(http, "ListTasks", {"status": "INVALID_STATUS"})
    assert "result" not in answer and answer["error"]["code"] == -32602
    resp = await http.get("/a2a/rest/tasks", params={"status": "INVALID_STATUS"}, headers=V1)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (
        error["status"] == "INVALID_ARGUMENT"
        and error["details"][0]["fieldViolations"][0]["field"] == "status"
    )
    done = await rpc(http, "ListTasks", {"status": "TASK_STATE_COMPLETED"})
    assert len(done["result"]["tasks"]) == 1
    assert (await rpc(http, "ListTasks", {"status": "TASK_STATE_WORKING"}))["result"].get("tasks", []) == []


# -- §3.6 versioning: one rule for every method --------------------------------------------------


async def test_one_version_rule_for_every_method(http) -> None:
    """§3.6.2: "Agents MUST process requests using the semantics of the requested A2A-Version"
    and "MUST interpret empty value as 0.3 version"; "If the version is not supported by the
    interface, agents MUST return a VersionNotSupportedError" (JSON-RPC -32009, §5.4).
    §3.6.1: "Clients MAY provide the A2A-Version as a request parameter instead of a header".
    SendMessage and GetTask answer alike."""
    task = await send_rpc(http)
    get = {"id": task["id"]}
    for headers in ({}, {"A2A-Version": ""}, {"A2A-Version": "0.3"}, {"A2A-Version": "2.0"}):
        for method, params in (("SendMessage", {"message": message()}), ("GetTask", get)):
            answer = await rpc(http, method, params, headers)
            assert "result" not in answer, (headers, method)
            asked = headers.get("A2A-Version") or "0.3"
            assert answer["error"]["code"] == -32009, (headers, method, answer)
            assert f"'{asked}'" in answer["error"]["message"]
    for method, params in (("SendMessage", {"message": message()}), ("GetTask", get)):
        assert "result" in await rpc(http, method, params, {"A2A-Version": "1.0"})
    by_parameter = await http.get(f"/a2a/rest/tasks/{task['id']}", params={"A2A-Version": "1.0"})
    assert by_parameter.status_code == 200 and by_parameter.json()["id"] == task["id"]
    without = await http.get(f"/a2a/rest/tasks/{task['id']}")
    assert without.status_code == 400


# -- §3.1 operations and §3.3.4 capability validation ----------------------------------------


async def test_task_operations_answer_with_the_specified_errors(http) -> None:
    """§3.1.3 Get Task: "TaskNotFoundError: The task ID does not exist or is not accessible"
    (-32001 / 404). §3.1.1: "Messages sent to Tasks that are in a terminal state ... cannot
    accept further messages" (UnsupportedOperationError, -32004). §3.1.5: a task in a terminal
    state is not cancelable (TaskNotCancelableError, -32002). Codes from §5.4."""
    missing = await rpc(http, "GetTask", {"id": "no-such-task"})
    assert missing["error"]["code"] == -32001
    assert (await http.get("/a2a/rest/tasks/no-such-task", headers=V1)).status_code == 404
    done = await send_rpc(http)
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    again = await rpc(http, "SendMessage", {"message": message(taskId=done["id"])})
    assert again["error"]["code"] == -32004
    cancel = await rpc(http, "CancelTask", {"id": done["id"]})
    assert cancel["error"]["code"] == -32002


async def test_undeclared_capabilities_are_refused(http) -> None:
    """§3.3.4: "If AgentCard.capabilities.pushNotifications is false or not present, operations
    related to push notification configuration ... MUST return
    PushNotificationNotSupportedError" (-32003); likewise Get Extended Agent Card without
    ``extendedAgentCard`` (-32004). Streaming is declared, and SendStreamingMessage streams."""
    card = (await http.get("/.well-known/agent-card.json")).json()
    capabilities = card["capabilities"]
    assert not capabilities.get("pushNotifications") and capabilities.get("streaming") is True
    assert not capabilities.get("extendedAgentCard")
    task = await send_rpc(http)
    config = {"taskId": task["id"], "url": "https://example.invalid/hook"}
    push = await rpc(http, "CreateTaskPushNotificationConfig", config)
    assert push["error"]["code"] == -32003
    listed = await rpc(http, "ListTaskPushNotificationConfigs", {"taskId": task["id"]})
    assert listed["error"]["code"] == -32003
    resp = await http.post(
        "/a2a/jsonrpc",
        json={"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": message()}},
        headers=V1,
    )
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert "statusUpdate" in resp.text and "-32004" not in resp.text
    extended = await rpc(http, "GetExtendedAgentCard", {})
    assert extended["error"]["code"] == -32004


async def test_no_redirect_is_built_from_the_host_header(http) -> None:
    """A path the A2A face does not serve is a 404, never a 307 whose Location repeats the
    client's Host header (a redirect an attacker could aim anywhere)."""
    for path in ("/a2a", "/a2a/", "/a2a/rest/tasks/", "/a2a/jsonrpc/"):
        # A loopback name: any other is refused on loopback before routing (403, no Location).
        resp = await http.get(path, headers={**V1, "Host": "evil.localhost"})
        assert resp.status_code == 404, (path, resp.status_code)
        assert "location" not in resp.headers
