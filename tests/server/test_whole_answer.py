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

from reachmesh.server.h1 import _OneWrite, whole_answer

HEAD = b"content-type: application/json\r\ncontent-length: 2\r\n"


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True


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
