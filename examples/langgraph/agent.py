"""The agent behind the LangGraph example: prices and promotions, answered by whichever copy runs.

reach agent --config examples/langgraph/reach_config.yaml --app examples/langgraph/agent.py:agent
"""

from __future__ import annotations

from typing import Any

from reachmesh import ReachAgent

agent = ReachAgent()


@agent.capability("lookup_price")
async def lookup_price(payload: dict[str, Any]) -> dict[str, Any]:
    return {"product_id": payload["product_id"], "price": 199.9, "currency": "CNY", "agent": agent.id}


@agent.capability("lookup_promotion")
async def lookup_promotion(payload: dict[str, Any]) -> dict[str, Any]:
    return {"product_id": payload["product_id"], "discount": 0.1, "agent": agent.id}
