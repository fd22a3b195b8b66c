"""A call's options are checked in the caller's process, with messages that name the option."""

from __future__ import annotations

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
