"""FakeAgent's port: chosen free when the agent is made, it may be taken before the first start."""

from __future__ import annotations

import socket

import pytest

from reachmesh.testing import FakeAgent


async def test_a_port_taken_before_the_first_start_is_replaced() -> None:
    agent = FakeAgent("a1")
    taken = socket.socket()
    taken.bind(("127.0.0.1", agent.port))
    taken.listen()
    try:
        await agent.start()
        assert agent.port != taken.getsockname()[1]
        assert str(agent.port) in agent.endpoint
    finally:
        await agent.stop()
        taken.close()


async def test_a_restart_keeps_its_port_and_says_when_it_is_taken() -> None:
    agent = FakeAgent("a1")
    await agent.start()
    port = agent.port
    await agent.stop()
    taken = socket.socket()
    taken.bind(("127.0.0.1", port))
    taken.listen()
    try:
        with pytest.raises(OSError):
            await agent.start()
        assert agent.port == port
    finally:
        taken.close()
