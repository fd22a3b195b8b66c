"""A Router whose port is taken fails before it starts anything (the embedder's model load)."""

from __future__ import annotations

import socket
import struct
from typing import Any

import pytest

from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError
from reachmesh.server.app import RouterApp
from reachmesh.server.serve import serve
from reachmesh.testing import RouterServer


def test_a_taken_port_fails_before_the_router_starts_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket is bound first: a taken port is a ConfigError naming it, and the app's start-up
    (which would load the model and start every background task) never runs."""
    app = RouterApp(RouterConfig())  # the default embedder: a model to load at start-up
    started: list[bool] = []

    async def startup() -> None:
        started.append(True)

    monkeypatch.setattr(app, "startup", startup)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot bind 127.0.0.1:{port}: address already in use"):
            serve(app, "127.0.0.1", port)
    assert started == []


def listen_backlog(sock: socket.socket) -> int:
    """A listening socket's backlog as the kernel keeps it (``tcpi_sacked`` of a listener)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("I", info, 28)[0])


@pytest.mark.parametrize("backlog", [None, 64])
async def test_the_routers_listen_backlog_is_the_policys(backlog: int | None) -> None:
    """``server.listen_backlog`` is the backlog the Router listens with (2,048 unless set): a
    burst of 10,000 connects overflowed uvicorn's fixed 2,048, and no policy key could raise it."""
    policy: dict[str, Any] = {"embedding": {"backend": "none"}}
    if backlog is not None:
        policy["server"] = {"listen_backlog": backlog}
    async with RouterServer(RouterConfig.model_validate(policy)) as server:
        (listening,) = [sock for each in server._server.servers for sock in each.sockets]
        assert listen_backlog(listening) == (backlog or 2048)
