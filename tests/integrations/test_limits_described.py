"""Declared limits reach the tools and skills a model chooses from, beside the description."""

from __future__ import annotations

import pytest

from reachmesh.integrations import described

ROW = {
    "task": "track_order",
    "description": "Shows where an order is.",
    "examples": [],
    "limits": ["cancel or change an order", "退款"],
    "inputSchema": None,
    "outputSchema": None,
    "agents": ["order-agent"],
}


def test_a_description_ends_with_what_the_capability_does_not_handle() -> None:
    assert described(ROW, "-") == "Shows where an order is. Does not handle: cancel or change an order; 退款."
    assert described({**ROW, "limits": []}, "-") == "Shows where an order is."
    assert described({**ROW, "description": "", "limits": []}, "fallback") == "fallback"


def test_the_mcp_tool_description_carries_the_limits() -> None:
    pytest.importorskip("mcp")
    from reachmesh.integrations.mcp import tools_from

    (tool,) = tools_from([ROW]).values()
    assert tool.description is not None and tool.description.endswith(
        "Does not handle: cancel or change an order; 退款."
    )
