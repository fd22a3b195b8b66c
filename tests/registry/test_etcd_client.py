"""The etcd client against answers no healthy member gives: each is a clear failure, never a crash."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from reachmesh.exceptions import RegistryUnavailable
from reachmesh.ports import free_port
from reachmesh.registry import etcdclient
from reachmesh.registry.etcdclient import EtcdClient
from reachmesh.testing import AsgiServer


class OddMember:
    """An HTTP server at an etcd member's address that answers ``/v3/kv/range`` as told."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.seen: list[str] = []  # the paths asked for
        self.app = Starlette(
            routes=[
                Route("/v3/kv/range", self.range, methods=["POST"]),
                Route("/elsewhere", self.range, methods=["POST", "GET"]),
            ]
        )

    async def range(self, request: Request) -> Response:
        self.seen.append(request.url.path)
        answer: Response = self.answer()
        return answer


async def _get(member: OddMember) -> str:
    async with AsgiServer(member.app) as server:
        client = EtcdClient([server.url], attempt_timeout=2, deadline=0.5, credentials=None)
        await client.open()
        try:
            with pytest.raises(RegistryUnavailable) as err:
                await client.get("/agent-reach/v1/x")
        finally:
            await client.close()
    return err.value.message


async def test_an_answer_over_the_bound_is_refused_not_buffered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A member sending more than MAX_ANSWER_BYTES is treated as broken."""
    monkeypatch.setattr(etcdclient, "MAX_ANSWER_BYTES", 1000)
    message = await _get(
        OddMember(lambda: Response(b"{" + b" " * 5000 + b"}", media_type="application/json"))
    )
    assert "an answer over 1000 bytes" in message


async def test_a_redirect_is_not_followed() -> None:
    """A 307 is never followed (a login's body would go with it) and says so."""
    member = OddMember(lambda: RedirectResponse("/elsewhere", status_code=307))
    message = await _get(member)
    assert "a redirect" in message and "not followed" in message
    assert member.seen and "/elsewhere" not in member.seen


async def test_a_page_that_is_not_json_is_quoted() -> None:
    """A proxy's page in place of etcd's JSON: its first words are in the reason."""
    message = await _get(
        OddMember(lambda: Response(b"<html>Bad gateway from the proxy</html>", status_code=502))
    )
    assert "not JSON: <html>Bad gateway from the proxy</html>" in message


async def test_a_member_that_refuses_connections_is_named_as_such() -> None:
    """Nothing listening at a member's address: the call's error and the member's status say
    "connection refused" and what to check (walk 49 saw aiohttp's "ClientConnectorError:
    Connect call failed ('127.0.0.1', 54185)", and /readyz only "etcd unreachable at ...")."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient([endpoint], attempt_timeout=0.5, deadline=0.3, credentials=None)
    await client.open()
    try:
        with pytest.raises(RegistryUnavailable) as err:
            await client.get("/agent-reach/v1/x")
        assert "connection refused, nothing listens there: is etcd running" in err.value.message
        assert not await client.status(endpoint, 0.5)
        assert client.failures[endpoint].startswith("connection refused")
    finally:
        await client.close()
