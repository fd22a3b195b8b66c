"""The demo price agent: current prices, and a fallback promotion lookup."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from reachmesh import AgentError, ReachAgent, ReachContext

agent = ReachAgent()

# Prices in CNY; other SKUs get a stable made-up price.
PRICES = {"SKU-88231": 199.9, "SKU-10001": 12.5, "MANGO": 8.8}
RATES = {"CNY": 1.0, "USD": 0.14, "EUR": 0.13}


def _price_cny(product_id: str) -> float:
    if product_id in PRICES:
        return PRICES[product_id]
    digest = int(hashlib.sha1(product_id.encode()).hexdigest()[:6], 16)
    return round(10 + digest % 50_000 / 100, 2)


def _now() -> str:
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


@agent.capability("query_product_price")
async def query_product_price(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
    currency = str(payload.get("currency") or "CNY").upper()
    if currency not in RATES:
        raise AgentError(f"unsupported currency {currency!r}", code="UNSUPPORTED_CURRENCY")
    price = round(_price_cny(payload["product_id"]) * RATES[currency], 2)
    return {"price": price, "currency": currency, "updated_at": _now()}


@agent.capability("query_promotion")
async def query_promotion(payload: dict[str, Any]) -> dict[str, Any]:
    # The price agent only knows list prices: no promotions of its own.
    return {"product_id": payload["product_id"], "promotions": [], "source": "price-query-agent"}
