"""A call's options are checked in the caller's process, with messages that name the option."""

from __future__ import annotations

from typing import Any

import pytest

from reachmesh import ReachClient, SyncReachClient
from reachmesh.testing import free_port


@pytest.mark.parametrize("bad", ["4000", 4000.5, True])
async def test_a_timeout_that_is_not_a_whole_number_is_named(bad: object) -> None:
    """timeout_ms="4000" (read from an environment variable, say) failed with "unsupported
    operand type(s) for /: 'str' and 'int'" from the client's own arithmetic. Nothing is sent:
    no Router listens at the URL."""
    url = f"http://127.0.0.1:{free_port()}"
    async with ReachClient(url) as client:
        with pytest.raises(TypeError, match=r"timeout_ms must be a whole number of milliseconds, got"):
            await client.call("t", {}, timeout_ms=bad)
    with SyncReachClient(url) as sync_client, pytest.raises(TypeError, match="timeout_ms"):
        sync_client.call("t", {}, timeout_ms=bad)


@pytest.mark.parametrize("option", ["read_timeout_ms", "connect_timeout_ms"])
async def test_the_attempt_timeouts_are_checked_and_named_too(option: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with ReachClient(url) as client:
        with pytest.raises(TypeError, match=rf"{option} must be a whole number of milliseconds, got '3000'"):
            options: dict[str, Any] = {option: "3000"}
            await client.call("t", {}, **options)


def test_a_long_read_timeout_without_a_deadline_is_waited_for() -> None:
    """The Router's default deadline grows with the read timeout asked for (connect + read + the
    retry allowance), so the client's own wait must too, or it gives up before the Router."""
    from reachmesh.sdk.client import DEFAULT_WAIT_S, prepare

    _, _, wait_s = prepare("t", {}, None, None, {"read_timeout_ms": 100_000})
    assert wait_s > 102
    _, _, default_s = prepare("t", {}, None, None, {})
    assert default_s == DEFAULT_WAIT_S
