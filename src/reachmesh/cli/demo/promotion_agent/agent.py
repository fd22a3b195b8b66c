"""The demo promotion agent: current promotions for a product."""

from __future__ import annotations

from typing import Any

from reachmesh import ReachAgent

agent = ReachAgent()

PROMOTIONS: dict[str, list[dict[str, Any]]] = {
    "SKU-88231": [
        {"type": "discount", "percent": 15, "ends": "2026-12-12T23:59:59.000Z"},
        {"type": "coupon", "amount": 20, "currency": "CNY", "min_spend": 150},
    ],
}


@agent.capability("query_promotion")
def query_promotion(payload: dict[str, Any]) -> dict[str, Any]:
    product_id = payload["product_id"]
    return {
        "product_id": product_id,
        "promotions": PROMOTIONS.get(product_id, []),
        "source": "promotion-agent",
    }
