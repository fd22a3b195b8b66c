"""An agent slower than the Router's read timeout, called with a long deadline.

The deadline (``timeoutMs``) bounds the request; each attempt is bounded by the read timeout
(``timeouts.read_ms``, 3 s by default). A caller who gave a slow agent a long deadline and got
``NO_AVAILABLE_HANDLER`` with the bare reason ``timeout`` could not tell which bound it hit, and
the SDK and the CLI could not ask for a longer read timeout at all.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
from typer.testing import CliRunner

from reachmesh import ReachClient
from reachmesh.cli.main import app
from reachmesh.config import RouterConfig
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer
from tests.helpers import scaled, until

# The policy's read timeout, kept short so the agent below is "slow" without a slow test.
READ_MS = int(scaled(300))


def _policy(**timeouts: int) -> RouterConfig:
    return RouterConfig.model_validate(
        {
            "embedding": {"backend": "none"},
            "health": {"enabled": False},
            "timeouts": {"read_ms": READ_MS, **timeouts},
            "retries": {"max_per_request": 0},
        }
    )


async def _held_call(preferences: dict[str, int]) -> httpx.Response:
    """One call with these preferences to an agent that holds it until the answer is back."""
    hold = asyncio.Event()
    agent = await FakeAgent("thinker", tasks=("think",), hold=hold).start()
    try:
        async with RouterServer(_policy()) as router, httpx.AsyncClient(timeout=30) as http:
            await agent.register(router.url, vectors=False)
            body = {"targetTask": "think", "preferences": preferences}
            resp = await http.post(f"{router.url}/reach", json=body)
            hold.set()
    finally:
        await agent.stop()
    return resp


async def test_a_read_timeout_is_named_with_the_setting_that_allows_longer() -> None:
    resp = await _held_call({"timeoutMs": int(scaled(10_000))})
    assert resp.status_code == 503
    error = resp.json()["error"]
    assert error["code"] == "NO_AVAILABLE_HANDLER"
    (candidate,) = error["candidates"]
    assert candidate["reason"] == "timeout"
    assert candidate["message"] == f"no answer within the {READ_MS} ms read timeout"
    assert f"'thinker' did not answer within the read timeout of {READ_MS} ms" in error["message"]
    assert "preferences.readTimeoutMs" in error["message"]


async def test_a_timeout_at_the_deadline_says_nothing_of_the_read_timeout() -> None:
    """When the request's own deadline ends the attempt, the read timeout was not the cause."""
    resp = await _held_call({"timeoutMs": int(scaled(300)), "readTimeoutMs": int(scaled(5_000))})
    assert resp.status_code == 504
    assert "read timeout" not in resp.text


async def test_the_sdk_asks_for_a_longer_read_timeout() -> None:
    agent = await FakeAgent("thinker", tasks=("think",), delay_s=3 * READ_MS / 1000).start()
    try:
        async with RouterServer(_policy()) as router:
            await agent.register(router.url, vectors=False)
            async with ReachClient(router.url) as client:
                resp = await client.call(
                    "think", {}, timeout_ms=int(scaled(10_000)), read_timeout_ms=int(scaled(8_000))
                )
    finally:
        await agent.stop()
    assert resp.ok, resp
    assert agent.received[-1]["preferences"]["readTimeoutMs"] == int(scaled(8_000))


def _router_with(agent: FakeAgent, policy: RouterConfig | None = None) -> Iterator[str]:
    with BackgroundLoop() as bg:
        server = bg.run(RouterServer(policy or _policy()).__aenter__())
        bg.on_close(lambda: server.__aexit__(None, None, None))
        bg.run(agent.start())
        bg.on_close(agent.stop)
        bg.run(agent.register(server.url, vectors=False))
        yield server.url


def test_reach_call_asks_for_a_longer_read_timeout() -> None:
    agent = FakeAgent("thinker", tasks=("think",), delay_s=3 * READ_MS / 1000)
    for url in _router_with(agent):
        args = ["call", "think", "--router", url, "--timeout-ms", str(int(scaled(10_000)))]
        slow = CliRunner().invoke(app, args)
        assert slow.exit_code == 1, slow.output
        assert "did not answer within the read timeout" in slow.output
        patient = CliRunner().invoke(app, [*args, "--read-timeout-ms", str(int(scaled(8_000)))])
        assert patient.exit_code == 0, patient.output
        assert agent.received[-1]["preferences"]["readTimeoutMs"] == int(scaled(8_000))


def test_reach_call_names_its_own_option_for_a_longer_read_timeout() -> None:
    """The Router's message names the envelope field (preferences.readTimeoutMs); a person at
    the command line is told the option that sends it, and nothing of it when the deadline cut
    the call."""
    agent = FakeAgent("thinker", tasks=("think",), delay_s=3 * READ_MS / 1000)
    for url in _router_with(agent):
        args = ["call", "think", "--router", url]
        slow = CliRunner().invoke(app, [*args, "--timeout-ms", str(int(scaled(10_000)))])
        assert slow.exit_code == 1, slow.output
        assert "hint: --read-timeout-ms N" in slow.output
        short = CliRunner().invoke(app, [*args, "--timeout-ms", str(READ_MS // 2)])
        assert short.exit_code == 1, short.output
        assert "hint:" not in short.output
    # Streamed, a plain handler's head comes with its result; the head's bound is the connect
    # and read timeouts together (1000 ms + READ_MS), so this agent is slower than both.
    sleeper = FakeAgent("thinker", tasks=("think",), delay_s=1.0 + 3 * READ_MS / 1000)
    for url in _router_with(sleeper):
        args = ["call", "think", "--router", url, "--stream", "--timeout-ms", str(int(scaled(10_000)))]
        streamed = CliRunner().invoke(app, args)
        assert streamed.exit_code == 1, streamed.output
        assert "no answer head within" in streamed.output
        assert "hint: --read-timeout-ms N" in streamed.output
        # The error's figure is the candidate's: the head's bound, not the read timeout alone.
        assert f"no answer head within {1000 + READ_MS} ms" in streamed.output
        assert f"did not answer within {1000 + READ_MS} ms (its connect and read timeouts)" in streamed.output
        assert f"read timeout of {READ_MS} ms" not in streamed.output


def test_a_call_cut_by_the_default_budget_names_what_sets_it() -> None:
    """A caller that gave no timeoutMs has the Router's default budget; its TIMEOUT said "the
    overall budget of N ms ran out" as if the caller had chosen N. The message says it is the
    default and the envelope field that sets it, and `reach call` names its own option."""
    budget_ms = int(scaled(300))
    agent = FakeAgent("thinker", tasks=("think",), delay_s=3 * budget_ms / 1000)
    for url in _router_with(agent, _policy(read_ms=int(scaled(5_000)), overall_ms=budget_ms)):
        cut = CliRunner().invoke(app, ["call", "think", "--router", url])
        assert cut.exit_code == 1, cut.output
        assert '"status": "TIMEOUT"' in cut.output
        default = f"the overall budget of {budget_ms} ms (the Router's default: the request gave no "
        assert default in cut.output
        assert "hint: --timeout-ms N" in cut.output
        chosen = CliRunner().invoke(app, ["call", "think", "--router", url, "--timeout-ms", str(budget_ms)])
        assert chosen.exit_code == 1, chosen.output
        assert "default" not in chosen.output and "hint:" not in chosen.output


async def test_a_deadline_spent_mostly_in_the_queue_says_so() -> None:
    """A caller who gave 1.5 s and waited most of it for a slot at a full agent read only "the
    overall budget ran out", as if the agent had been slow: the time it queued is now named."""
    hold = asyncio.Event()
    agent = await FakeAgent("thinker", tasks=("think",), hold=hold, max_concurrency=1).start()
    try:
        async with RouterServer(_policy()) as router, httpx.AsyncClient(timeout=30) as http:
            await agent.register(router.url, vectors=False)
            # The first call holds the only slot until its own read timeout frees it.
            first_prefs = {"timeoutMs": int(scaled(5_000)), "readTimeoutMs": int(scaled(400))}
            first = asyncio.create_task(
                http.post(f"{router.url}/reach", json={"targetTask": "think", "preferences": first_prefs})
            )
            await until(lambda: agent.received, "the first call at the agent")
            second_prefs = {"timeoutMs": int(scaled(1_500)), "readTimeoutMs": int(scaled(5_000))}
            second = await http.post(
                f"{router.url}/reach", json={"targetTask": "think", "preferences": second_prefs}
            )
            await first
            hold.set()
    finally:
        await agent.stop()
    assert second.status_code == 504, second.text
    assert len(agent.received) == 2  # it was sent, after its wait
    message = second.json()["error"]["message"]
    assert re.fullmatch(
        rf"the overall budget of {int(scaled(1_500))} ms ran out,"
        r" \d+ ms of it waiting for a slot at a full agent",
        message,
    ), message
