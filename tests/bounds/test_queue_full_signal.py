"""The capacity board says "queue full" with its own exception, and only that reads as full.

Found by a reviewer's probe: the attempt caught ``LookupError`` from the board, so a KeyError or an
IndexError of a bug inside it was answered as an agent whose line is full (the next candidate, then
OVERLOADED), hiding the bug. Real Router and agent on loopback.
"""

from __future__ import annotations

import logging

import pytest

from reachmesh.resilience import capacity
from tests.helpers import one_slot_held


async def test_a_bug_inside_the_capacity_board_is_an_internal_error_not_overloaded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    async with one_slot_held("bug-agent") as (http, _board, release, held):

        def broken_join(self: object, client: str, waiter: object) -> None:
            raise KeyError(client)

        monkeypatch.setattr(capacity._Slots, "join", broken_join)
        resp = await http.post("/reach", json={"targetTask": "slow"})
        assert (resp.status_code, resp.json()["status"]) == (500, "INTERNAL_ERROR")
        assert any(r.exc_info is not None and isinstance(r.exc_info[1], KeyError) for r in caplog.records), (
            "the board's bug is logged with its traceback"
        )
        monkeypatch.undo()
        release.set()
        assert (await held).json()["status"] == "SUCCESS"
