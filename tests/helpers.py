"""Small helpers shared by tests."""

from __future__ import annotations

import pytest

from agent_reach.observability.logging import TRACE_LOGGER, split_lines


def log_lines(caplog: pytest.LogCaptureFixture, logger: str = TRACE_LOGGER) -> list[str]:
    """Every line logged by ``logger``; a request's trace lines arrive as one multi-line record."""
    return [text for r in caplog.records if r.name == logger for text, _ in split_lines(r)]
