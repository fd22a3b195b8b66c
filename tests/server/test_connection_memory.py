"""What one client connection costs the Router while its request is in flight (issue #34: a
burst holds one per call; the goal is 24 KiB per call in flight in all)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

from reachmesh.config import RouterConfig
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import until

CALL = b'{"targetTask": "echo", "payload": {"n": 1}}'
HEAD = (
    b"POST /reach HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(CALL)
)
CONNECTIONS = 40


async def test_a_connection_waiting_for_its_body_stays_small_and_still_reads_it() -> None:
    """Forty connections that sent a request head and part of its body: the server side of each
    (the transport, uvicorn's protocol and parser, the request cycle and its events) held 8.6
    KiB on the test's asyncio loop: the head checks' seven attributes grew the protocol's
    instance dict by 1.6 KB, and two asyncio Events held a 624-byte deque each. Now 6.2 KiB.
    The rest of each body then arrives, and every request is answered (the leaner events
    still wake the body's reader)."""
    policy = RouterConfig.from_mapping({"health": {"enabled": False}})
    async with RouterServer(policy) as server:
        agent = await FakeAgent("echoer").start()
        try:
            await agent.register(server.url, vectors=False)
            opened = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(CONNECTIONS)]
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                for _, writer in opened:
                    writer.write(HEAD + CALL[:10])
                state = server._server.server_state

                def heads_read() -> bool:
                    connections: list[Any] = list(state.connections)
                    return len(connections) == CONNECTIONS and all(c.cycle is not None for c in connections)

                await until(heads_read, "every head read")
                gc.collect()
                held = (tracemalloc.get_traced_memory()[0] - before) / CONNECTIONS
            finally:
                tracemalloc.stop()
            for _, writer in opened:
                writer.write(CALL[10:])
            for reader, writer in opened:
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), head
                writer.close()
            assert len(agent.received) == CONNECTIONS
        finally:
            await agent.stop()
    # 6.2 KiB quiet; the window also counts what the Router's own background work keeps while the
    # heads are read, which a busy machine stretches (6.8 KiB seen beside a full suite). The bound
    # still fails the 8.6 KiB this test was written against.
    assert held < 7.5 * 1024, f"{held:.0f} bytes per connection"
