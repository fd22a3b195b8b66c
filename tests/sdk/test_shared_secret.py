"""An SDK agent answers whoever reaches its port, unless it checks the secret the Router sends."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from reachmesh import AgentConfig, ReachAgent
from reachmesh.config import RouterConfig
from reachmesh.dispatch.agentsecret import AgentSecrets
from reachmesh.exceptions import ConfigError
from reachmesh.sdk import agent as agent_module
from reachmesh.testing import RouterServer, free_port
from tests.helpers import scaled

SECRET = "agent-shared-secret-0123456789"


def config(router_url: str, agent_id: str, **server: str) -> AgentConfig:
    port = free_port()
    return AgentConfig.from_mapping(
        {
            "agent": {
                "id": agent_id,
                "network": {"endpoint": f"http://127.0.0.1:{port}/reach"},
                "capabilities": [{"task": "echo"}],
            },
            "router": {"url": router_url},
            "server": server,
        },
        env={"MY_AGENT_SECRET": SECRET},
    )


def router_policy(**outbound: object) -> RouterConfig:
    return RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "outbound": outbound}
    )


async def test_an_agent_with_a_secret_answers_the_router_and_refuses_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Router sends the secret its policy names: the call succeeds. The same callback
    reached directly, without the secret or with a wrong one, is 401 UNAUTHORIZED (before,
    it answered anyone who reached the port)."""
    monkeypatch.setenv("ROUTER_SIDE_SECRET", SECRET)
    async with RouterServer(router_policy(agent_secret_env="ROUTER_SIDE_SECRET")) as router:
        agent = ReachAgent(config(router.url, "secret-agent", shared_secret_env="MY_AGENT_SECRET"))
        agent.capability("echo")(lambda payload: {"echo": payload})
        await agent.start()
        try:
            async with httpx.AsyncClient(timeout=15) as http:
                resp = await http.post(
                    f"{router.url}/reach", json={"targetTask": "echo", "payload": {"n": 1}}
                )
                assert resp.json()["status"] == "SUCCESS", resp.text
                endpoint = agent.config.profile.network.endpoint
                for headers in ({}, {"X-Reach-Agent-Secret": "guess"}):
                    direct = await http.post(
                        endpoint, json={"targetTask": "echo", "payload": {}}, headers=headers
                    )
                    assert direct.status_code == 401, direct.text
                    assert direct.json()["error"]["code"] == "UNAUTHORIZED"
                    assert SECRET not in direct.text
        finally:
            await agent.stop()


async def test_per_agent_secrets_and_the_reach_agent_option(monkeypatch: pytest.MonkeyPatch) -> None:
    """A glob's secret wins over the global one: the agent given only the global one through
    ReachAgent(shared_secret=...) refuses the Router's call for an id the glob matches, and the
    caller sees why (AGENT_ERROR, code UNAUTHORIZED)."""
    monkeypatch.setenv("GLOBAL_SECRET", "global-0123456789")
    monkeypatch.setenv("BILLING_SECRET", SECRET)
    policy = router_policy(
        agent_secret_env="GLOBAL_SECRET", agent_secret_envs={"billing-*": "BILLING_SECRET"}
    )
    secrets = AgentSecrets.from_policy(policy.outbound)
    assert secrets.for_agent("billing-eu") == SECRET and secrets.for_agent("other") == "global-0123456789"
    assert SECRET not in repr(secrets)
    async with RouterServer(policy) as router:
        right = ReachAgent(config(router.url, "billing-eu"), shared_secret=SECRET)
        wrong = ReachAgent(config(router.url, "billing-us"), shared_secret="global-0123456789")
        for agent in (right, wrong):
            agent.capability("echo")(lambda payload: payload)
            await agent.start()
        try:
            async with httpx.AsyncClient(timeout=15) as http:
                answers = {}
                for agent_id in ("billing-eu", "billing-us"):
                    body = {
                        "targetTask": "echo",
                        "payload": {},
                        "preferences": {"filterAgentIds": [agent_id]},
                    }
                    answers[agent_id] = (await http.post(f"{router.url}/reach", json=body)).json()
                assert answers["billing-eu"]["status"] == "SUCCESS", answers
                refused = answers["billing-us"]
                assert (refused["status"], refused["error"]["code"]) == ("AGENT_ERROR", "UNAUTHORIZED")
        finally:
            for agent in (right, wrong):
                await agent.stop()


def test_a_named_secret_variable_that_is_unset_is_a_config_error() -> None:
    """On either side: the author believes the agent checks callers; it must not silently not."""
    with pytest.raises(ConfigError, match="NOT_SET_ANYWHERE"):
        config("http://127.0.0.1:7200", "a", shared_secret_env="NOT_SET_ANYWHERE")
    with pytest.raises(ConfigError, match=r"outbound\.agent_secret_env"):
        AgentSecrets.from_policy(router_policy(agent_secret_env="NOT_SET_ANYWHERE").outbound, {})


async def test_a_stranger_cannot_hold_the_agents_port_with_silent_or_slow_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection that sends no whole request is closed after IDLE_CONNECTION_S (aiohttp's
    default held it an hour, secret or not), and a body trickled after its headers is answered
    408 after BODY_TIMEOUT_S (the handler waited for it without end)."""
    monkeypatch.setattr(agent_module, "IDLE_CONNECTION_S", scaled(0.5))
    monkeypatch.setattr(agent_module, "BODY_TIMEOUT_S", scaled(0.5))
    async with RouterServer(router_policy()) as router:
        agent = ReachAgent(config(router.url, "held-open"))
        agent.capability("echo")(lambda payload: payload)
        await agent.start()
        try:
            silent = await asyncio.open_connection("127.0.0.1", agent.port)
            partial = await asyncio.open_connection("127.0.0.1", agent.port)
            partial[1].write(b"POST /reach HTTP/1.1\r\nHost: x\r\n")
            slow = await asyncio.open_connection("127.0.0.1", agent.port)
            slow[1].write(
                b"POST /reach HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"targetTask"'
            )
            bound = scaled(10)
            assert await asyncio.wait_for(silent[0].read(), bound) == b""
            assert await asyncio.wait_for(partial[0].read(), bound) == b""
            answer = await asyncio.wait_for(slow[0].read(4096), bound)
            assert answer.startswith(b"HTTP/1.1 408")
            assert b'"code":"BODY_TIMEOUT"' in answer
            for _, writer in (silent, partial, slow):
                writer.close()
        finally:
            await agent.stop()
