"""Issue #12: an agent behind a degraded Router keeps retrying its renewal before the lease runs out."""

from __future__ import annotations

import httpx

from reachmesh.sdk.agent import callback_trap
from reachmesh.sdk.lease import LeaseKeeper, _said


def keeper(ttl: float) -> LeaseKeeper:
    lease = LeaseKeeper("http://127.0.0.1:9", {"id": "a"}, callback="http://127.0.0.1:9/reach", tasks=["t"])
    lease.ttl_seconds = ttl
    return lease


def test_a_503_renewal_is_retried_with_growing_pauses_that_fit_in_the_lease() -> None:
    """503 REGISTRY_UNAVAILABLE: pauses grow, stay under TTL/6, so several tries precede expiry."""
    lease = keeper(60)
    backoff = 0.25
    waits = []
    for _ in range(8):
        wait, backoff = lease.retry_after(503, backoff)
        waits.append(wait)
    assert waits[0] < waits[3]
    assert max(waits) <= 60 / 6
    assert sum(waits[:4]) < 60 / 3  # four tries before the usual first retry would even start
    lease.close()


def test_other_errors_wait_a_third_of_the_ttl() -> None:
    """A 500 is a Router in trouble: retried no faster than usual."""
    lease = keeper(30)
    assert lease.retry_after(500, 0.25) == (10.0, 0.25)
    lease.close()


def test_a_loopback_callback_with_a_remote_router_is_flagged() -> None:
    """localhost as the callback while the Router is elsewhere: the compose trap, named."""
    message = callback_trap("http://localhost:8001/reach", "http://reach-router:7200")
    assert message is not None and "REACH_CALLBACK_URL" in message
    assert callback_trap("http://127.0.0.1:8001/reach", "http://10.0.0.5:7200") is not None


def test_matching_callbacks_are_not_flagged() -> None:
    """Both on loopback, or both on the network: nothing to say."""
    assert callback_trap("http://127.0.0.1:8001/reach", "http://localhost:7200") is None
    assert callback_trap("http://price-agent:8001/reach", "http://reach-router:7200") is None
    assert callback_trap("http://price-agent:8001/reach", "http://127.0.0.1:7200") is None


def test_refused_credentials_end_registration_at_once(monkeypatch) -> None:
    """401 from a Router with auth on: a ConfigError naming REACH_TOKEN, not retries forever."""
    import pytest

    from reachmesh.exceptions import ConfigError
    from reachmesh.testing import BackgroundLoop, RouterServer

    monkeypatch.setenv("REACH_ADMIN_TOKEN", "sdk-admin-token-2718")
    with BackgroundLoop() as background:
        router: RouterServer = background.run(RouterServer().__aenter__())
        background.on_close(lambda: router.__aexit__(None, None, None))
        monkeypatch.delenv("REACH_ADMIN_TOKEN")
        monkeypatch.delenv("REACH_TOKEN", raising=False)
        profile = {
            "id": "no-token",
            "network": {"endpoint": "http://127.0.0.1:9/reach"},
            "capabilities": [{"task": "t"}],
        }
        lease = LeaseKeeper(router.url, profile, callback="http://127.0.0.1:9/reach", tasks=["t"])
        try:
            with pytest.raises(ConfigError, match="REACH_TOKEN"):
                lease.register_until_done()
        finally:
            lease.close()


def test_a_failed_renewal_is_logged_with_the_routers_reason() -> None:
    """The agent's log says why the Router refused (etcd's refusal, say), not only the status."""
    answer = {"error": {"code": "REGISTRY_UNAVAILABLE", "message": "etcd refused the Router:\nx"}}
    assert _said(httpx.Response(503, json=answer)) == ": etcd refused the Router:\\nx"
    assert _said(httpx.Response(503, content=b"<html>busy</html>")) == ""
    assert _said(httpx.Response(503, json=["not", "an", "object"])) == ""
