"""What a newcomer to the admin page missed: a decline's reason, a link to a trace, a traffic
table that fits, scores a person can read (a real headless Chromium, as test_admin_ui)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from reachmesh import Decline, ReachContext
from tests.browser.conftest import MESH_POLICY, Mesh, quote, sdk_agent, start_mesh
from tests.browser.test_admin_ui import console_errors, open_page, shows, until

pytestmark = pytest.mark.browser

LONG_TASK = "summarize_quarterly_supplier_contract_renewals"
LONG_AGENT = "contract-summarizer-for-the-procurement-team"


async def picky(payload: dict[str, Any], ctx: ReachContext) -> dict[str, Any]:
    raise Decline("I only quote prices for groceries")


@pytest.fixture(scope="module")
def mesh() -> Iterator[Mesh]:
    mesh = start_mesh(MESH_POLICY)
    try:
        mesh.start(sdk_agent(mesh.url, "price-agent-a", "quote_price", quote))
        mesh.start(sdk_agent(mesh.url, "price-agent-b", "quote_price", quote))
        mesh.start(sdk_agent(mesh.url, "picky-agent", "quote_fare", picky))
        mesh.start(sdk_agent(mesh.url, LONG_AGENT, LONG_TASK, quote))
        yield mesh
    finally:
        mesh.bg.close()


def trace_shown(trace_id: str) -> str:
    return f'#trace-body[data-trace="{trace_id}"] .hop'


def test_a_decline_shows_the_agents_reason_in_the_trace_view(mesh: Mesh, browser: Any) -> None:
    answer = mesh.reach("quote_fare", "ui-decline-1")
    assert answer["status"] == "NO_AVAILABLE_HANDLER", answer
    open_page(browser, mesh.url)
    until(browser, shows('#traffic-table tr[data-trace="ui-decline-1"]'), 3, "the declined request")
    browser.find_element(By.CSS_SELECTOR, '#traffic-table tr[data-trace="ui-decline-1"]').click()
    until(browser, shows(trace_shown("ui-decline-1")), 3, "the trace")
    row = browser.find_element(By.CSS_SELECTOR, '#trace-body tr[data-candidate="picky-agent"]')
    assert "declined" in row.text
    assert "I only quote prices for groceries" in row.text
    assert console_errors(browser) == []


def test_a_link_opens_the_trace_it_names_and_a_click_names_it_in_the_address(
    mesh: Mesh, browser: Any
) -> None:
    for trace_id in ("ui-link:1", "ui-link.2"):
        assert mesh.reach("quote_price", trace_id)["status"] == "SUCCESS"
    browser.get(f"{mesh.url}/admin/ui#trace=ui-link%3A1")
    until(browser, shows(trace_shown("ui-link:1")), 3, "the linked trace")
    assert browser.find_element(By.ID, "trace-id").text == "ui-link:1"
    until(browser, shows('#traffic-table tr[data-trace="ui-link.2"]'), 3, "the other request")
    browser.find_element(By.CSS_SELECTOR, '#traffic-table tr[data-trace="ui-link.2"]').click()
    until(browser, shows(trace_shown("ui-link.2")), 3, "the clicked trace")
    assert browser.current_url.endswith("#trace=ui-link.2")


def test_the_live_traffic_table_fits_at_1400_px_and_shows_the_duration(mesh: Mesh, browser: Any) -> None:
    browser.set_window_size(1400, 1000)
    trace_id = "ui-wide-" + "x" * 100
    assert mesh.reach(LONG_TASK, trace_id)["status"] == "SUCCESS"
    assert mesh.reach("no_such_task_anywhere_in_this_mesh", "ui-wide-2")["status"] == "NO_AVAILABLE_HANDLER"
    open_page(browser, mesh.url)
    until(browser, shows('#traffic-table tr[data-trace="ui-wide-2"]'), 3, "the requests")
    fit = browser.execute_script(
        """
        const box = document.querySelector('#traffic .scroll');
        const cells = [...document.querySelectorAll('#traffic-table tbody td:last-child')];
        const right = box.getBoundingClientRect().right;
        return {scroll: box.scrollWidth, client: box.clientWidth,
                hidden: cells.filter((c) => c.getBoundingClientRect().right > right + 0.5).length};
        """
    )
    assert fit["scroll"] <= fit["client"], fit
    assert fit["hidden"] == 0, fit


def test_scores_and_factors_are_rounded_for_display(mesh: Mesh, browser: Any) -> None:
    for n in range(3):
        assert mesh.reach("quote_price", f"ui-score-{n}")["status"] == "SUCCESS"
    open_page(browser, mesh.url)
    until(browser, shows('#traffic-table tr[data-trace="ui-score-2"]'), 3, "the request")
    browser.find_element(By.CSS_SELECTOR, '#traffic-table tr[data-trace="ui-score-2"]').click()
    until(browser, shows(trace_shown("ui-score-2")), 3, "the trace")
    text = browser.find_element(By.ID, "trace-body").text
    assert "share" in text
    long = re.findall(r"\d\.\d{4,}", text)
    assert long == [], text
