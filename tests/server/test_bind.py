"""A Router whose port is taken fails before it starts anything (the embedder's model load)."""

from __future__ import annotations

import socket

import pytest

from reachmesh.config import RouterConfig
from reachmesh.exceptions import ConfigError
from reachmesh.server.app import RouterApp
from reachmesh.server.serve import serve


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
