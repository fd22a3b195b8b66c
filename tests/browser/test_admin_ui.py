"""The admin page (/admin/ui) in a real headless Chromium, against a live Router and agents."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from reachmesh.registry.memory import MemoryRegistry
from reachmesh.server.ui import CSP
from reachmesh.testing import FakeAgent, free_port
from tests.browser.conftest import MESH_POLICY, Mesh, quote, sdk_agent, start_mesh

# Deadlines here are the page's goals times the suite's factor: 1 checks them as stated; a slower
# machine sets REACH_TEST_TIME_SCALE rather than loosen a test.
from tests.helpers import TIME_SCALE
from tests.procs import chaos_agent

pytestmark = pytest.mark.browser


def until(driver: Any, check: Callable[[Any], Any], seconds: float, what: str) -> Any:
    """Poll the page until ``check`` is truthy, or fail saying what did not show up in time."""
    ignored = (StaleElementReferenceException,)
    return WebDriverWait(driver, seconds * TIME_SCALE, 0.05, ignored).until(check, what)


def shows(selector: str) -> Callable[[Any], Any]:
    """A wait condition: the elements ``selector`` finds, truthy once there is one."""
    return lambda driver: driver.find_elements(By.CSS_SELECTOR, selector)


def agent_status(driver: Any, agent_id: str) -> str | None:
    cells = driver.find_elements(By.CSS_SELECTOR, f'#agent-table tr[data-agent="{agent_id}"] td[data-status]')
    return cells[0].get_attribute("data-status") if cells else None


def open_page(driver: Any, url: str) -> None:
    driver.get(f"{url}/admin/ui")


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_page_lists_agents_shows_a_new_request_and_its_trace(mesh: Mesh, browser: Any) -> None:
    """Agents listed; a call shows in the live tail within 2 s; a click opens its hops and route."""
    open_page(browser, mesh.url)
    # One missed probe shows an agent suspect for a moment: wait for all three, not one snapshot.
    agents = ("concierge-agent", "price-agent-a", "price-agent-b")
    until(browser, lambda d: all(agent_status(d, a) == "available" for a in agents), 5, "the agents table")
    row = browser.find_element(By.CSS_SELECTOR, '#agent-table tr[data-agent="concierge-agent"]')
    assert "Concierge" in row.text and "plan_trip" in row.text

    called = time.monotonic()
    answer = mesh.reach("plan_trip", "ui-trace-0001")
    assert answer["status"] == "SUCCESS", answer
    selector = '#traffic-table tr[data-trace="ui-trace-0001"]'
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, selector), 2, "the new request in the tail")
    shown_after = time.monotonic() - called
    print(f"\nrequest shown in the live tail {shown_after:.2f} s after the call returned")
    # Two rows for one trace: the caller's hop and the concierge's nested call, both SUCCESS.
    rows = browser.find_elements(By.CSS_SELECTOR, selector)
    until(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, selector)) == 2, 2, "both hops")
    rows = browser.find_elements(By.CSS_SELECTOR, selector)
    assert {r.find_elements(By.TAG_NAME, "td")[2].text for r in rows} == {"plan_trip", "quote_price"}

    rows[0].click()
    until(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#trace-body .hop")) == 2, 2, "the hops")
    assert browser.find_element(By.ID, "trace-id").text == "ui-trace-0001"
    hops = browser.find_elements(By.CSS_SELECTOR, "#trace-body .hop")
    assert "plan_trip" in hops[0].text and "nested" not in hops[0].text
    assert "quote_price" in hops[1].text and "nested, depth 1" in hops[1].text
    # The waterfall draws a bar per hop; the route decision lists both price agents with factors.
    assert len(browser.find_elements(By.CSS_SELECTOR, "#trace-body svg.waterfall rect.bar-ok")) == 2
    candidates = hops[1].find_elements(By.CSS_SELECTOR, "tr[data-candidate]")
    assert {c.get_attribute("data-candidate") for c in candidates} == {"price-agent-a", "price-agent-b"}
    chosen = [c for c in candidates if "selected" in c.text]
    assert len(chosen) == 1 and "weight" in chosen[0].text and "share" in chosen[0].text

    # The Router panel: the chart's legend names the statuses it drew (one sample step and one
    # refresh later), and the facts count the requests.
    legend = "#chart-legend li"
    until(
        browser,
        lambda d: "SUCCESS" in " ".join(e.text for e in d.find_elements(By.CSS_SELECTOR, legend)),
        5,
        "chart",
    )
    assert "requests" in browser.find_element(By.ID, "router-facts").text

    # Filter by task: only the agents that declare a matching task stay.
    browser.find_element(By.ID, "task-filter").send_keys("quote")
    shown = {
        r.get_attribute("data-agent") for r in browser.find_elements(By.CSS_SELECTOR, "#agent-table tbody tr")
    }
    assert shown == {"price-agent-a", "price-agent-b"}
    assert console_errors(browser) == []


def test_pause_stops_the_tail_and_resume_catches_up(mesh: Mesh, browser: Any) -> None:
    # A request of its own first: this test may be the first of the module on its worker, with
    # nothing in the tail yet.
    mesh.reach("quote_price", "ui-trace-before-pause")
    open_page(browser, mesh.url)
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#traffic-table tbody tr"), 5, "the tail")
    browser.find_element(By.ID, "pause").click()
    assert browser.find_element(By.ID, "traffic-state").text == "paused"
    mesh.reach("quote_price", "ui-trace-paused")
    selector = '#traffic-table tr[data-trace="ui-trace-paused"]'
    # Paused: the tail must not move. Watched for three poll intervals, then resumed.
    end = time.monotonic() + 3
    while time.monotonic() < end:
        assert not browser.find_elements(By.CSS_SELECTOR, selector)
        time.sleep(0.1)
    browser.find_element(By.ID, "pause").click()
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, selector), 2, "the request after resuming")


def test_a_killed_agent_changes_status_and_the_route_says_why(
    mesh: Mesh, browser: Any, tmp_path: Path
) -> None:
    """kill -9 an agent process: within the probe and lease times its row leaves "available"."""
    name = "doomed-agent"
    (tmp_path / f"{name}.faults.json").write_text("{}")
    proc = chaos_agent(tmp_path, name, mesh.url, free_port(), free_port())
    try:
        open_page(browser, mesh.url)
        until(browser, lambda d: agent_status(d, name) == "available", 30, "the agent process registered")
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(5)
        killed = time.monotonic()
        # Probes every 0.5 s (suspect after one failure, unhealthy after two), a 2 s lease, and
        # the page's 2 s refresh: the row must change within lease + refresh (and a second of slack).
        until(browser, lambda d: agent_status(d, name) not in (None, "available"), 5, "the status change")
        took = time.monotonic() - killed
        print(f"\nstatus {agent_status(browser, name)!r} on the page {took:.2f} s after kill -9")
        answer = mesh.reach("chaos", "ui-trace-dead")
        assert answer["status"] != "SUCCESS"
        selector = '#traffic-table tr[data-trace="ui-trace-dead"]'
        until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, selector), 2, "the failed request")
        browser.find_element(By.CSS_SELECTOR, selector).click()
        rows = "#trace-body tr[data-candidate]"
        until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, rows), 2, "the route decision")
        candidate = browser.find_element(By.CSS_SELECTOR, f'#trace-body tr[data-candidate="{name}"]')
        reason = candidate.find_element(By.CSS_SELECTOR, "td.reason").text
        assert reason in ("suspect", "unhealthy", "offline", "connect_error", "circuit_open"), reason
    finally:
        proc.stop()


def test_a_script_tag_display_name_renders_as_text(mesh: Mesh, browser: Any) -> None:
    evil = '<script>window.__pwned = 1; alert("x")</script><img src=x onerror="window.__pwned = 2">'
    mesh.start(sdk_agent(mesh.url, "evil-agent", "evil_task", quote, display_name=evil))
    try:
        open_page(browser, mesh.url)
        until(browser, lambda d: agent_status(d, "evil-agent") is not None, 5, "the agent's row")
        row = browser.find_element(By.CSS_SELECTOR, '#agent-table tr[data-agent="evil-agent"]')
        name = row.find_element(By.CSS_SELECTOR, ".name")
        assert name.text == evil and name.is_displayed()
        assert row.find_elements(By.CSS_SELECTOR, "script, img") == []
        assert browser.find_elements(By.CSS_SELECTOR, "body img") == []
        assert browser.execute_script("return window.__pwned === undefined") is True
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text  # noqa: B018
    finally:
        mesh.stop("evil-agent")


def test_the_page_sends_a_strict_csp_and_the_data_needs_a_token(mesh: Mesh) -> None:
    page = httpx.get(f"{mesh.url}/admin/ui")
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == CSP
    policy = page.headers["content-security-policy"]
    for directive in (
        "default-src 'none'",
        "script-src 'self'",
        "frame-ancestors 'none'",
        "form-action 'none'",
    ):
        assert directive in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    script = httpx.get(f"{mesh.url}/admin/ui/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "innerHTML" not in script.text and "eval(" not in script.text


ADMIN = "admin-token-for-the-page"
CALLER = "caller-token-for-the-page"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def guarded() -> Any:
    policy = {
        **MESH_POLICY,
        "auth": {
            "tokens": [
                {"sha256": sha(ADMIN), "role": "admin", "name": "ops"},
                {"sha256": sha(CALLER), "role": "caller", "name": "shop"},
            ]
        },
    }
    mesh = start_mesh(policy)
    agent = mesh.bg.run(FakeAgent("guarded-agent", tasks=("echo",)).start())
    profile = {**agent.profile(), "display_name": "Guarded", "managed": True}
    answer = httpx.post(f"{mesh.url}/agents", json=profile, headers={"Authorization": f"Bearer {ADMIN}"})
    assert answer.status_code == 201, answer.text
    try:
        yield mesh
    finally:
        mesh.bg.run(agent.stop())
        mesh.bg.close()


def log_in(driver: Any, token: str) -> None:
    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()


def test_with_auth_on_the_page_asks_refuses_and_then_shows(guarded: Mesh, browser: Any) -> None:
    open_page(browser, guarded.url)
    until(browser, lambda d: d.find_element(By.ID, "login").is_displayed(), 5, "the token prompt")
    assert not browser.find_element(By.ID, "main").is_displayed()

    log_in(browser, "not-a-token-anyone-knows")
    error = until(browser, lambda d: d.find_element(By.ID, "login-error").text, 3, "the refusal")
    assert "does not know this token" in error

    log_in(browser, CALLER)
    until(browser, lambda d: "caller token" in d.find_element(By.ID, "login-error").text, 3, "the refusal")
    assert "admin token" in browser.find_element(By.ID, "login-error").text
    assert not browser.find_element(By.ID, "main").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('reach.adminToken')") is None

    log_in(browser, ADMIN)
    until(browser, lambda d: agent_status(d, "guarded-agent") is not None, 5, "the agents")
    assert not browser.find_element(By.ID, "login").is_displayed()
    # Kept for the tab only: in sessionStorage, never in the URL or a cookie.
    assert browser.execute_script("return sessionStorage.getItem('reach.adminToken')") == ADMIN
    assert ADMIN not in browser.current_url and browser.get_cookies() == []
    # The data the page shows needs the token: without it the Router refuses.
    assert httpx.get(f"{guarded.url}/admin/agents").status_code == 401

    browser.find_element(By.ID, "forget-token").click()
    until(browser, lambda d: d.find_element(By.ID, "login").is_displayed(), 3, "the prompt again")
    assert browser.execute_script("return sessionStorage.getItem('reach.adminToken')") is None


def test_trace_ids_with_dots_and_colons_open_their_own_trace(mesh: Mesh, browser: Any) -> None:
    """Trace ids are [A-Za-z0-9._:-] (but not "." or "..", which the Router refuses because no URL
    can name them): "ui:trace.1" and "...a..b" each open their own trace."""
    open_page(browser, mesh.url)
    for trace_id in ("ui:trace.1", "...a..b"):
        assert mesh.reach("quote_price", trace_id)["status"] == "SUCCESS"
        selector = f'#traffic-table tr[data-trace="{trace_id}"]'
        until(browser, shows(selector), 2, f"the row of {trace_id}")
        browser.find_element(By.CSS_SELECTOR, selector).click()
        assert browser.find_element(By.ID, "trace-id").text == trace_id
        hop = f'#trace-body[data-trace="{trace_id}"] .hop'
        until(browser, shows(hop), 2, f"the trace {trace_id}")
        assert "quote_price" in browser.find_element(By.CSS_SELECTOR, hop).text
    assert mesh.reach("quote_price", "..")["status"] == "INVALID_REQUEST"


class FlakyStore(MemoryRegistry):
    """The memory registry, told when to say its store is out of reach (as etcd's would)."""

    outage: str | None = None

    def degraded(self) -> str | None:
        return self.outage


def test_degraded_mode_shows_and_clears(browser: Any) -> None:
    registry = FlakyStore()
    mesh = start_mesh(MESH_POLICY, registry=registry)
    try:
        open_page(browser, mesh.url)
        pills = "#router-state .pill"
        until(
            browser,
            lambda d: "ready" in [p.text for p in d.find_elements(By.CSS_SELECTOR, pills)],
            5,
            "ready",
        )
        registry.outage = "etcd <b>unreachable</b> since 12:00"
        degraded = "degraded: etcd <b>unreachable</b> since 12:00"
        until(
            browser,
            lambda d: degraded in [p.text for p in d.find_elements(By.CSS_SELECTOR, pills)],
            3,
            "degraded",
        )
        assert browser.find_elements(By.CSS_SELECTOR, "#router-state b") == []
        registry.outage = None
        until(
            browser,
            lambda d: all("degraded" not in p.text for p in d.find_elements(By.CSS_SELECTOR, pills)),
            3,
            "gone",
        )
    finally:
        mesh.bg.close()


def test_the_waterfall_marks_a_streams_chunks(mesh: Mesh, browser: Any) -> None:
    """A streamed call's hop carries a tick per chunk time the trace kept (the first 200) and
    one at the last chunk; the hop's details say how many chunks came and when."""
    from reachmesh.decision import MAX_CHUNK_MARKS

    total = MAX_CHUNK_MARKS + 20

    async def talk(payload: dict[str, Any], ctx: Any) -> Any:
        for n in range(total):
            if n == total - 1:
                # The Router stamps the chunks of one read with one time; a pause keeps the last
                # chunk's time apart from the 200th kept mark, so that it gets a tick of its own.
                await asyncio.sleep(0.05)
            yield n

    mesh.start(sdk_agent(mesh.url, "talker-agent", "talk_long", talk))
    body = {
        "traceId": "ui-trace-stream",
        "targetTask": "talk_long",
        "sourceAgent": "browser-test",
        "payload": {},
    }
    reply = httpx.post(f"{mesh.url}/reach", json=body, headers={"Accept": "text/event-stream"}, timeout=10)
    assert reply.text.count("event: chunk") == total and "event: done" in reply.text
    open_page(browser, mesh.url)
    selector = '#traffic-table tr[data-trace="ui-trace-stream"]'
    until(browser, shows(selector), 5, "the streamed call in the tail")
    browser.find_element(By.CSS_SELECTOR, selector).click()
    marks = "#trace-body svg.waterfall g.chunks"
    until(browser, shows(marks), 2, "the stream's chunk marks")
    group = browser.find_element(By.CSS_SELECTOR, marks)
    assert group.get_attribute("data-chunks") == str(total)
    assert len(group.find_elements(By.CSS_SELECTOR, "line.chunk")) == MAX_CHUNK_MARKS + 1
    hop = browser.find_element(By.CSS_SELECTOR, "#trace-body .hop")
    assert f"{total} chunks" in hop.text and "first chunk" in hop.text and "last chunk" in hop.text
    assert console_errors(browser) == []


def test_a_hop_that_waited_for_a_slot_shows_the_wait(mesh: Mesh, browser: Any) -> None:
    """An agent that takes one call at a time: the second call waits in the Router for the slot,
    and its trace view says how long ("waited for a slot"); the first's says nothing of it."""

    async def new_event() -> asyncio.Event:
        return asyncio.Event()

    hold: asyncio.Event = mesh.bg.run(new_event())
    agent = FakeAgent("one-slot", tasks=("slow_quote",), max_concurrency=1, hold=hold)
    mesh.bg.run(agent.start())
    mesh.bg.on_close(agent.stop)
    mesh.bg.run(agent.register(mesh.url, vectors=False))
    capacity = mesh.router.app.parts.dispatcher.forwarding.capacity
    with ThreadPoolExecutor(2) as calls:
        first = calls.submit(_held_reach, mesh, "slow_quote", "ui-slot-first")
        poll(lambda: len(agent.received) == 1, "the first call at the agent")
        second = calls.submit(_held_reach, mesh, "slow_quote", "ui-slot-second")
        poll(lambda: capacity.queued("one-slot") == 1, "the second call waiting for the slot")
        mesh.bg.loop.call_soon_threadsafe(hold.set)
        assert first.result()["status"] == "SUCCESS"
        assert second.result()["status"] == "SUCCESS"
    open_page(browser, mesh.url)
    for trace_id, waited in (("ui-slot-second", True), ("ui-slot-first", False)):
        selector = f'#traffic-table tr[data-trace="{trace_id}"]'
        until(browser, shows(selector), 5, f"the row of {trace_id}")
        browser.find_element(By.CSS_SELECTOR, selector).click()
        hop = f'#trace-body[data-trace="{trace_id}"] .hop'
        until(browser, shows(hop), 2, f"the trace {trace_id}")
        assert ("waited for a slot" in browser.find_element(By.CSS_SELECTOR, hop).text) is waited
    assert console_errors(browser) == []


def _held_reach(mesh: Mesh, task: str, trace_id: str) -> dict[str, Any]:
    """``mesh.reach`` for a call held at its agent while the test goes on: it asks a read timeout
    and a deadline as long as the test's (the defaults, 3 s and 5 s, are not scaled)."""
    held_ms = int(20_000 * TIME_SCALE)
    body = {
        "traceId": trace_id,
        "targetTask": task,
        "sourceAgent": "browser-test",
        "payload": {},
        "preferences": {"timeoutMs": held_ms, "readTimeoutMs": held_ms},
    }
    answer: dict[str, Any] = httpx.post(f"{mesh.url}/reach", json=body, timeout=30 * TIME_SCALE).json()
    return answer


def poll(check: Callable[[], bool], what: str, seconds: float = 10) -> None:
    """Poll ``check`` until it holds, or fail saying what did not happen in time."""
    deadline = time.monotonic() + seconds * TIME_SCALE
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds * TIME_SCALE:.0f} s"
        time.sleep(0.02)
