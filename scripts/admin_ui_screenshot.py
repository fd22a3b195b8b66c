"""Make docs/img/admin-ui.png: the admin page over a small live mesh, in headless Chromium.

    .venv/bin/python scripts/admin_ui_screenshot.py [--out docs/img/admin-ui.png] [--seconds 40]

A Router on loopback, the demo's two agents plus a shopping assistant that calls both through
the Router (nested hops) and a flaky agent, a few requests a second for ``--seconds``; then the
page opens one nested trace and is photographed. Needs chromium and chromium-driver
(scripts/test-deps installs them).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from reachmesh.config import RouterConfig
from reachmesh.sdk import AgentConfig, AgentError, ReachAgent, ReachContext
from reachmesh.testing import BackgroundLoop, RouterServer, free_port

ROOT = Path(__file__).resolve().parent.parent
POLICY: dict[str, Any] = {
    "registry": {"lease_ttl_seconds": 10},
    "health": {"interval_seconds": 1, "timeout_ms": 500},
    "embedding": {"backend": "none"},
    "routing": {"default_strategy": "weighted_round_robin"},
    "retries": {"max_per_request": 1},
}


def agent(router_url: str, agent_id: str, name: str, task: str, weight: float = 10) -> ReachAgent:
    profile = {
        "id": agent_id,
        "display_name": name,
        "network": {"endpoint": f"http://127.0.0.1:{free_port()}/reach"},
        "capabilities": [{"task": task, "routing_weight": weight}],
    }
    return ReachAgent(AgentConfig.from_mapping({"agent": profile, "router": {"url": router_url}}, env={}))


def build_agents(url: str) -> list[ReachAgent]:
    price = agent(url, "price-query-agent", "Price query", "query_product_price")
    price_b = agent(url, "price-query-agent-2", "Price query (2)", "query_product_price", weight=5)
    promo = agent(url, "promotion-agent", "Promotions", "query_promotion")
    assistant = agent(url, "shopping-assistant", "Shopping assistant", "plan_purchase")
    flaky = agent(url, "inventory-agent", "Inventory (flaky)", "check_stock")

    async def quote(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0.005, 0.03))
        return {"price": 199.9, "currency": "CNY"}

    async def promotions(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
        return {"promotions": [{"type": "discount", "percent": 15}]}

    async def plan(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
        got = await ctx.call("query_product_price", {"product_id": "SKU-88231"})
        deals = await ctx.call("query_promotion", {"product_id": "SKU-88231"})
        return {"price": got.result, "deals": deals.result}

    async def stock(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
        if random.random() < 0.3:
            raise AgentError("warehouse API timed out", code="UPSTREAM", retryable=False)
        return {"in_stock": 12}

    price.capability("query_product_price")(quote)
    price_b.capability("query_product_price")(quote)
    promo.capability("query_promotion")(promotions)
    assistant.capability("plan_purchase")(plan)
    flaky.capability("check_stock")(stock)
    return [price, price_b, promo, assistant, flaky]


def traffic(url: str, seconds: float) -> str:
    """A few requests a second of each kind; returns the traceId of the last nested one."""
    last = ""
    end = time.monotonic() + seconds
    n = 0
    with httpx.Client(base_url=url, timeout=10) as http:
        while time.monotonic() < end:
            n += 1
            task = random.choice(
                ["plan_purchase", "query_product_price", "check_stock", "check_stock", "nope"]
            )
            trace_id = f"demo-{n:05d}"
            http.post("/reach", json={"traceId": trace_id, "targetTask": task, "sourceAgent": "web-shop"})
            if task == "plan_purchase":
                last = trace_id
            time.sleep(random.uniform(0.05, 0.3))
    return last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "admin-ui.png")
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args()
    random.seed(7)
    with BackgroundLoop() as bg, tempfile.TemporaryDirectory() as profile_dir:
        router = RouterServer(RouterConfig.from_mapping(POLICY))
        bg.run(router.__aenter__())
        bg.on_close(lambda: router.__aexit__(None, None, None))
        for each in build_agents(router.url):
            bg.run(each.start())
            bg.on_close(each.stop)
        nested = traffic(router.url, args.seconds)
        options = Options()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for arg in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1440,1500",
            f"--user-data-dir={profile_dir}",
        ):
            options.add_argument(arg)
        service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
        driver = webdriver.Chrome(service=service, options=options)
        try:
            driver.get(f"{router.url}/admin/ui")
            wait = WebDriverWait(driver, 15)
            row = f'#traffic-table tr[data-trace="{nested}"]'
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, row))
            driver.find_element(By.CSS_SELECTOR, row).click()
            wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#trace-body .hop")) >= 3)
            time.sleep(2.5)  # one more refresh of the chart and the agents' lease ages
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
        finally:
            driver.quit()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
