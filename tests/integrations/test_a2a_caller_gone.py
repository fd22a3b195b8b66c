"""An A2A caller that leaves a plain (not streamed) call stops it, as a ``/reach`` caller does.

Real a2a-sdk behind the export, a raw agent and a raw caller on loopback. The call must stop at
once (the Router closes the agent's connection), no other agent is tried, and the record books
it to the caller (``CALLER_GONE``, attempt outcome ``caller_gone``), judging no agent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

pytest.importorskip("a2a")

from reachmesh.config import RouterConfig
from reachmesh.integrations.a2a import A2AExport
from reachmesh.testing import RouterServer, free_port
from tests.helpers import caller_leaves_plain_call, raw_post, scaled

pytestmark = pytest.mark.integrations

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}

MESSAGE = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"data": {"q": "hi"}}]}


def request_of(kind: str, timeout_ms: int) -> tuple[str, dict[str, str], bytes]:
    """(path, headers, body) of a blocking SendMessage: the export's own fast path (JSON-RPC,
    A2A 1.0), a2a-sdk's HTTP+JSON binding, and a2a-sdk's A2A 0.3 JSON-RPC."""
    metadata = {"skill": "talk", "timeoutMs": timeout_ms}
    if kind == "jsonrpc":
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {"message": MESSAGE, "metadata": metadata},
        }
        return "/a2a/jsonrpc", {"A2A-Version": "1.0"}, orjson.dumps(body)
    if kind == "rest":
        return (
            "/a2a/rest/message:send",
            {"A2A-Version": "1.0"},
            orjson.dumps({"message": MESSAGE, "metadata": metadata}),
        )
    old = {
        "kind": "message",
        "messageId": "m1",
        "role": "user",
        "parts": [{"kind": "data", "data": {"q": "hi"}}],
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {"message": old, "metadata": metadata},
    }
    return "/a2a/jsonrpc", {}, orjson.dumps(body)


@pytest.fixture
async def router() -> AsyncIterator[RouterServer]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    async with RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as server:  # type: ignore[arg-type]
        yield server


@pytest.mark.parametrize("kind", ["jsonrpc", "rest", "jsonrpc-0.3"])
async def test_an_a2a_caller_that_leaves_a_plain_call_stops_it(router: RouterServer, kind: str) -> None:
    path, headers, body = request_of(kind, int(scaled(30_000)))
    await caller_leaves_plain_call(router, raw_post(path, body, headers))
