"""Answers and requests held to the end of the loop's turn (reachmesh.outbox), on the wire.

The Router runs on uvloop, which runs I/O callbacks between the turn that held a write and the
outbox's call that makes it: what arrives then (a caller's FIN, an agent's close) must not make a
held write vanish. These tests force a held write with ``outbox(loop).inflight`` (another
exchange under way) and act at the moment it is held.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvloop

from reachmesh.config import RouterConfig
from reachmesh.outbox import Outbox, outbox
from reachmesh.server.h1 import _OneWrite
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import scaled
from tests.server.test_response_writes import Answers, post_reach


async def _read_to_eof(sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), scaled(10)):
        data += chunk
    return data


def test_an_answer_held_when_the_callers_fin_arrives_still_reaches_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller that half-closes after its request (``shutdown(SHUT_WR)``) while the answer is
    held: uvloop reads the FIN before the outbox writes, and uvicorn closes on it. The held
    answer leaves first, as it did when it was written at once."""
    hold = Outbox.hold

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        async with RouterServer(RouterConfig()) as router:
            agent = await FakeAgent("a").start()
            try:
                await agent.register(router.url, vectors=False)
                sock = socket.create_connection(("127.0.0.1", router.port))
                sock.setblocking(False)

                def fin_when_held(self: Outbox, writer: Any, held_on: asyncio.AbstractEventLoop) -> None:
                    hold(self, writer, held_on)
                    if isinstance(writer, _OneWrite):
                        sock.shutdown(socket.SHUT_WR)

                monkeypatch.setattr(Outbox, "hold", fin_when_held)
                box = outbox(loop)
                box.inflight += 1  # another exchange under way: the answer is held
                try:
                    await loop.sock_sendall(sock, post_reach())
                    data = await _read_to_eof(sock)
                finally:
                    box.inflight -= 1
                    sock.close()
                assert box.inflight == 0
                return data
            finally:
                await agent.stop()

    data = uvloop.run(main())
    answers = Answers()
    answers.parser.feed_data(data)
    assert [status for status, _, _ in answers.done] == [200]
