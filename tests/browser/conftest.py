"""A real headless Chromium (Debian's chromium + chromium-driver) driven by Selenium, and a mesh.

The mesh is a Router on loopback with SDK agents that renew short leases, on a background event
loop, so the synchronous WebDriver calls can watch the page while the Router serves.
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from reachmesh import AgentConfig, ReachAgent, ReachContext
from reachmesh.config import RouterConfig
from reachmesh.testing import BackgroundLoop, RouterServer, free_port

# Short leases and fast probes, so a killed agent shows within seconds; the loop-lag gate is off
# because a loaded test machine (a browser beside the suite) must not turn answers into 429s.
MESH_POLICY: dict[str, Any] = {
    "registry": {"lease_ttl_seconds": 2, "sweep_interval_seconds": 0.05},
    "health": {"interval_seconds": 0.5, "timeout_ms": 500, "unhealthy_after": 2, "jitter": 0},
    "limits": {"loop_lag_ms": 10_000},
    "embedding": {"backend": "none"},
    # Weighted routing records each candidate's factors, which the trace view must show.
    "routing": {"default_strategy": "weighted_round_robin"},
}

Handler = Callable[[dict[str, Any], ReachContext], Awaitable[dict[str, Any]]]


def chromium(user_data_dir: Path) -> Any:
    """A fresh headless Chromium on its own profile; fails (never skips) when it is not installed."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium")
    driver_bin = shutil.which("chromedriver")
    if binary is None or driver_bin is None:
        pytest.fail("the browser tests need Debian's chromium and chromium-driver: run scripts/test-deps")
    options = Options()
    options.binary_location = binary
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1440,1100",
        f"--user-data-dir={user_data_dir}",
    ):
        options.add_argument(arg)
    # The console, to check that the page breaks none of its own Content-Security-Policy.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver: Selenium Manager would try to download one, and nothing is reachable.
    return webdriver.Chrome(service=Service(executable_path=driver_bin), options=options)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    driver = chromium(tmp_path / "chromium-profile")
    try:
        yield driver
    finally:
        driver.quit()


def sdk_agent(
    router_url: str,
    agent_id: str,
    task: str,
    handler: Handler,
    *,
    display_name: str | None = None,
    headers: dict[str, str] | None = None,
) -> ReachAgent:
    """An SDK agent on a free loopback port (not started) that serves ``task`` with ``handler``."""
    profile: dict[str, Any] = {
        "id": agent_id,
        "network": {"endpoint": f"http://127.0.0.1:{free_port()}/reach"},
        "capabilities": [{"task": task, "description": f"{task} for the admin page test"}],
    }
    if display_name is not None:
        profile["display_name"] = display_name
    agent = ReachAgent(AgentConfig.from_mapping({"agent": profile, "router": {"url": router_url}}, env={}))
    agent.capability(task)(handler)
    return agent


@dataclass
class Mesh:
    """A Router and its agents on a background loop."""

    bg: BackgroundLoop
    router: RouterServer
    agents: dict[str, ReachAgent] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.router.url

    def start(self, agent: ReachAgent) -> ReachAgent:
        self.bg.run(agent.start())
        self.agents[agent.id] = agent
        return agent

    def stop(self, agent_id: str) -> None:
        self.bg.run(self.agents.pop(agent_id).stop())

    def reach(self, task: str, trace_id: str, **headers: str) -> dict[str, Any]:
        body = {"traceId": trace_id, "targetTask": task, "sourceAgent": "browser-test", "payload": {}}
        reply = httpx.post(f"{self.url}/reach", json=body, headers=headers, timeout=10)
        answer: dict[str, Any] = reply.json()
        return answer


def start_mesh(policy: dict[str, Any], **app_kwargs: Any) -> Mesh:
    bg = BackgroundLoop()
    router = RouterServer(RouterConfig.from_mapping(policy), **app_kwargs)
    bg.run(router.__aenter__())
    mesh = Mesh(bg, router)

    async def close() -> None:
        for agent in list(mesh.agents.values()):
            await agent.stop()
        await router.__aexit__(None, None, None)

    bg.on_close(close)
    return mesh


async def quote(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
    return {"price": 199.9}


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    """A concierge agent whose handler calls ``quote_price`` (a nested hop) served by two agents."""
    mesh = start_mesh(MESH_POLICY)
    try:

        async def plan(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
            inner = await ctx.call("quote_price", {"product_id": "SKU-88231"})
            return {"plan": "ok", "price": inner.result}

        mesh.start(sdk_agent(mesh.url, "concierge-agent", "plan_trip", plan, display_name="Concierge"))
        mesh.start(sdk_agent(mesh.url, "price-agent-a", "quote_price", quote, display_name="Price A"))
        mesh.start(sdk_agent(mesh.url, "price-agent-b", "quote_price", quote, display_name="Price B"))
        yield mesh
    finally:
        mesh.bg.close()
