"""A LangGraph graph whose two agent nodes are Reach nodes instead of hand-wired calls.

Before: a `price` node and a `promotion` node, each holding an HTTP client, a URL and its own
error handling for one specific agent. After: each is `reach_node(task)`; the Router picks the
agent, fails over, and answers NO_AVAILABLE_HANDLER when nobody can take it, which the graph
branches on. Run it beside `reach router` and two copies of agent.py:

    REACH_ROUTER_URL=http://127.0.0.1:7200 python examples/langgraph/graph.py SKU-88231
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from reachmesh import ReachClient
from reachmesh.integrations.langgraph import branch_on, reach_node


class Shopping(TypedDict, total=False):
    product_id: str
    price: dict[str, Any] | None
    promotion: dict[str, Any] | None
    reach_status: str
    reach_error: dict[str, Any] | None
    answer: str


def answer(state: Shopping) -> dict[str, Any]:
    price, promotion = state.get("price") or {}, state.get("promotion") or {}
    total = price["price"] * (1 - promotion.get("discount", 0))
    return {"answer": f"{state['product_id']}: {total:.2f} {price['currency']}"}


def apologise(state: Shopping) -> dict[str, Any]:
    error = state.get("reach_error") or {}
    return {"answer": f"no agent can answer right now ({state['reach_status']}: {error.get('message')})"}


def build_graph(client: ReachClient) -> Any:
    """price → promotion → answer, with a branch to `apologise` on any Router failure."""
    graph = StateGraph(Shopping)
    graph.add_node("price", reach_node("lookup_price", inputs=["product_id"], output="price", client=client))
    graph.add_node(
        "promotion", reach_node("lookup_promotion", inputs=["product_id"], output="promotion", client=client)
    )
    graph.add_node("answer", answer)
    graph.add_node("apologise", apologise)
    graph.add_edge(START, "price")
    failed = {"NO_AVAILABLE_HANDLER": "apologise", "TIMEOUT": "apologise", "CONTEXT_UNAVAILABLE": "apologise"}
    graph.add_conditional_edges(
        "price", branch_on(), {"SUCCESS": "promotion", **failed, "AGENT_ERROR": "apologise"}
    )
    graph.add_conditional_edges(
        "promotion", branch_on(), {"SUCCESS": "answer", **failed, "AGENT_ERROR": "apologise"}
    )
    graph.add_edge("answer", END)
    graph.add_edge("apologise", END)
    return graph.compile()


async def main(product_id: str) -> None:
    async with ReachClient(source_agent="shopping-graph") as client:  # REACH_ROUTER_URL
        graph = build_graph(client)
        state = await graph.ainvoke({"product_id": product_id}, {"configurable": {"thread_id": "demo"}})
    print(state["answer"])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "SKU-88231"))
