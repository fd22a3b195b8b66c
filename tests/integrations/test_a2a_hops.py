"""The A2A face counts the Routers a request came through too (X-Reach-Hops), as POST /reach does:
a Router registered as an A2A agent of itself is cut at the bound, not 256 deep. Real Router with
its A2A face on loopback."""

from __future__ import annotations

import pytest

pytest.importorskip("a2a")

import httpx

from reachmesh.config import RouterConfig
from reachmesh.integrations.a2a import JSONRPC_PATH, A2AExport
from reachmesh.testing import RouterServer, free_port
from reachmesh.transport.base import MAX_HOPS
from tests.helpers import scaled

POLICY = {"health": {"enabled": False}, "embedding": {"backend": "none"}, "limits": {"loop_lag_ms": 10_000}}
CALL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "SendMessage",
    "params": {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hello"}]}},
}


async def test_the_a2a_face_refuses_a_request_past_the_hop_bound() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(POLICY)
    async with (
        RouterServer(config, port=port, middleware=lambda app: A2AExport(app, url)) as router,  # type: ignore[arg-type]
        httpx.AsyncClient(base_url=router.url, timeout=scaled(30)) as http,
    ):
        headers = {"X-Reach-Hops": str(MAX_HOPS), "A2A-Version": "1.0"}
        answer = await http.post(JSONRPC_PATH, json=CALL, headers=headers)
        assert answer.status_code == 508, answer.text
        assert answer.json()["error"]["code"] == "LOOP_DETECTED"
        below = await http.post(JSONRPC_PATH, json=CALL, headers={**headers, "X-Reach-Hops": "1"})
        assert below.status_code != 508, below.text
