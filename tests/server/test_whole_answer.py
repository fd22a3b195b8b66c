"""server/h1.py whole_answer: a /reach answer written in one go, past uvicorn's send().

The wire behaviour (pipelining, Connection: close, refusals) is in test_response_writes; this
checks the one function against a stand-in for uvicorn's response cycle: what it writes, the
cycle state it leaves, and when it hands the answer back to uvicorn's own send() instead.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from reachmesh.config import ServerPolicy
from reachmesh.outbox import outbox
from reachmesh.server.h1 import _OneWrite, bounded_protocol, whole_answer

HEAD = b"content-type: application/json\r\ncontent-length: 2\r\n"


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def cycle(**state: Any) -> SimpleNamespace:
    ended: list[bool] = []
    base = {
        "disconnected": False,
        "response_started": False,
        "access_log": False,
        "flow": SimpleNamespace(write_paused=False),
        "waiting_for_100_continue": True,
        "default_headers": [(b"date", b"Thu, 03 Dec 2026 12:00:00 GMT")],
        "keep_alive": True,
        "response_complete": False,
        "message_event": asyncio.Event(),
        "on_response": lambda: ended.append(True),
        "ended": ended,
    }
    base.update(state)
    return SimpleNamespace(**base)


_LOOP = asyncio.new_event_loop()  # only its call_soon is used; closed at the end of the module


def teardown_module() -> None:
    _LOOP.close()


def one_write(transport: Transport) -> _OneWrite:
    return _OneWrite(transport, _LOOP)  # type: ignore[arg-type]


def test_a_whole_answer_is_one_write_and_ends_the_cycle_as_uvicorns_send_does() -> None:
    transport, state = Transport(), cycle()
    assert whole_answer(one_write(transport), state, 200, HEAD, b"{}")  # type: ignore[arg-type]
    assert transport.writes == [
        b"HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 12:00:00 GMT\r\n" + HEAD + b"\r\n{}"
    ]
    assert state.response_started and state.response_complete and not state.waiting_for_100_continue
    assert state.message_event.is_set()
    assert state.ended == [True]
    assert not transport.closed


def test_without_keep_alive_it_says_connection_close_and_closes() -> None:
    transport, state = Transport(), cycle(keep_alive=False, default_headers=[])
    assert whole_answer(one_write(transport), state, 429, HEAD, b"{}")  # type: ignore[arg-type]
    assert transport.writes == [b"HTTP/1.1 429 Too Many Requests\r\n" + HEAD + b"connection: close\r\n\r\n{}"]
    assert transport.closed


def test_a_held_write_leaves_first() -> None:
    transport = Transport()
    writer = one_write(transport)
    writer.write(b"HTTP/1.1 200 OK\r\n\r\n")  # held, as a pipelined answer's head would be
    assert whole_answer(writer, cycle(), 200, HEAD, b"{}")  # type: ignore[arg-type]
    assert transport.writes[0] == b"HTTP/1.1 200 OK\r\n\r\n"
    assert transport.writes[1].startswith(b"HTTP/1.1 200 OK\r\ndate:")


@pytest.mark.parametrize(
    "state",
    [
        {"response_started": True},
        {"access_log": True},
        {"flow": SimpleNamespace(write_paused=True)},
    ],
    ids=["already-started", "access-log", "write-paused"],
)
def test_it_hands_back_to_uvicorn_and_writes_nothing(state: dict[str, Any]) -> None:
    transport, answer_cycle = Transport(), cycle(**state)
    assert not whole_answer(one_write(transport), answer_cycle, 200, HEAD, b"{}")  # type: ignore[arg-type]
    assert transport.writes == []
    assert answer_cycle.ended == []


def test_a_gone_client_gets_nothing_and_nothing_fails() -> None:
    transport, state = Transport(), cycle(disconnected=True)
    assert whole_answer(one_write(transport), state, 200, HEAD, b"{}")  # type: ignore[arg-type]
    assert transport.writes == []


# -- under load: an answer held to the end of the loop's turn (reachmesh.outbox) -------------


def test_while_calls_wait_on_agents_an_answer_leaves_at_the_end_of_the_turn_with_the_others() -> None:
    loop = asyncio.new_event_loop()
    try:
        first, second = Transport(), Transport()
        writers = [_OneWrite(first, loop), _OneWrite(second, loop)]  # type: ignore[arg-type]
        box = outbox(loop)
        box.inflight = 1  # another call is waiting on its agent
        states = [cycle(), cycle()]
        for writer, state in zip(writers, states, strict=True):
            assert whole_answer(writer, state, 200, HEAD, b"{}")  # type: ignore[arg-type]
            assert state.response_complete and state.ended == [True]  # the cycle ends as before
        assert first.writes == [] and second.writes == []  # held, not lost
        loop.run_until_complete(asyncio.sleep(0))  # one turn of the loop
        assert len(first.writes) == 1 and first.writes[0].endswith(b"\r\n\r\n{}")
        assert len(second.writes) == 1
    finally:
        loop.close()


def test_a_held_answer_leaves_before_anything_written_or_closed_after_it() -> None:
    loop = asyncio.new_event_loop()
    try:
        transport = Transport()
        writer = _OneWrite(transport, loop)  # type: ignore[arg-type]
        outbox(loop).inflight = 1
        assert whole_answer(writer, cycle(), 200, HEAD, b"{}")  # type: ignore[arg-type]
        writer.flush()  # what uvicorn's own writes and closes do first (GuardedHttpTools)
        writer.close()
        assert transport.writes[0].endswith(b"{}") and transport.closed
        loop.run_until_complete(asyncio.sleep(0))
        assert len(transport.writes) == 1  # written once, not again by the outbox
    finally:
        loop.close()


def test_a_held_answer_to_a_caller_who_left_is_dropped_and_the_others_still_leave() -> None:
    loop = asyncio.new_event_loop()
    try:
        gone, staying = Transport(), Transport()
        outbox(loop).inflight = 1
        for transport in (gone, staying):
            assert whole_answer(_OneWrite(transport, loop), cycle(), 200, HEAD, b"{}")  # type: ignore[arg-type]
        gone.closed = True  # the connection closed before the turn ended
        loop.run_until_complete(asyncio.sleep(0))
        assert gone.writes == []
        assert len(staying.writes) == 1
    finally:
        loop.close()


def test_with_no_other_call_in_flight_the_answer_is_written_at_once() -> None:
    loop = asyncio.new_event_loop()
    try:
        transport = Transport()
        assert outbox(loop).inflight == 0
        assert whole_answer(_OneWrite(transport, loop), cycle(), 200, HEAD, b"{}")  # type: ignore[arg-type]
        assert len(transport.writes) == 1  # a lone caller (c1) does not wait for the turn's end
    finally:
        loop.close()


class _ConnTransport(Transport):
    """What uvicorn's connection_made and flow control ask of a transport, besides writes."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope: Any, receive: Any, send: Any) -> None:
    pass


@pytest.mark.parametrize("hook", ["send_400_response", "shutdown", "timeout_keep_alive_handler"])
async def test_uvicorns_own_writes_and_closes_come_after_a_held_answer(hook: str) -> None:
    config = Config(app=_app, log_level="warning")
    config.load()
    protocol = bounded_protocol(ServerPolicy())(config, ServerState(), {}, asyncio.get_running_loop())
    transport = _ConnTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol._one_write.hold(b"the held answer")
    if hook == "send_400_response":
        protocol.send_400_response("Invalid HTTP request received.")
    else:
        getattr(protocol, hook)()
    assert transport.writes[0] == b"the held answer"
    assert transport.writes[1:] == [] or transport.writes[1].startswith(b"HTTP/1.1 400")
    assert transport.closed
