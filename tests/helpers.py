"""Small helpers shared by tests."""

from __future__ import annotations

import pytest

from reachmesh.observability.logging import TRACE_LOGGER, split_lines
from reachmesh.testing import FakeAgent


def log_lines(caplog: pytest.LogCaptureFixture, logger: str = TRACE_LOGGER) -> list[str]:
    """Every line logged by ``logger``; a request's trace lines arrive as one multi-line record."""
    return [text for r in caplog.records if r.name == logger for text, _ in split_lines(r)]


def price_agent() -> FakeAgent:
    """The reference price agent (not started): a description and a few examples, zh and en."""
    return FakeAgent(
        "price-agent",
        tasks=("query_product_price",),
        descriptions={"query_product_price": "查询指定商品的当前售价"},
        examples={
            "query_product_price": [
                "这个多少钱",
                "what is the price of this item",
                "苹果多少钱一斤",
                "how much does it cost",
            ]
        },
    )
