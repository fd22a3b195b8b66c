"""free_port(): ports below the kernel's ephemeral range, which no outgoing connection takes."""

from __future__ import annotations

import socket

import pytest

from reachmesh import ports


def test_ports_come_from_below_the_ephemeral_range_and_are_bindable() -> None:
    floor = ports._ephemeral_floor()
    found = {ports.free_port() for _ in range(200)}
    assert all(ports._LOWEST <= port < floor for port in found), sorted(found)[:5]
    assert len(found) > 150  # spread out, so parallel test workers rarely draw the same one
    port = found.pop()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_taken_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy: int = taken.getsockname()[1]
        drawn = [busy, busy, 23_456]

        class Scripted:
            @staticmethod
            def randrange(low: int, high: int) -> int:
                return drawn.pop(0)

        monkeypatch.setattr(ports, "_pick", Scripted)
        assert not ports._bindable(busy)
        assert ports.free_port() == 23_456 and drawn == []


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ports.RANGE_ENV, raising=False)  # the suite gives each worker a range
    real_floor = ports._ephemeral_floor()
    monkeypatch.setattr(ports, "_ephemeral_floor", lambda: 10_050)
    port = ports.free_port()
    assert port >= real_floor and ports._bindable(port)  # bind(0): from the ephemeral range


def test_a_range_of_its_own_is_kept_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """REACH_FREE_PORT_RANGE (each test worker has one): every port comes from it."""
    monkeypatch.setenv(ports.RANGE_ENV, "20000-20400")
    found = {ports.free_port() for _ in range(100)}
    assert all(20_000 <= port < 20_400 for port in found), sorted(found)


@pytest.mark.parametrize("raw", ["", "junk", "20000", "30000-20000", "80-90", "20000-70000", "1-x"])
def test_a_range_that_makes_no_sense_is_ignored(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(ports.RANGE_ENV, raw)
    assert ports._search_range() == (ports._LOWEST, ports._ephemeral_floor())
