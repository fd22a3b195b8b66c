"""A page on another origin, in a real headless Chromium, cannot drive a Router whose auth is off."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from selenium.webdriver.support.ui import WebDriverWait

from reachmesh.testing import free_port
from tests.browser.conftest import MESH_POLICY, Mesh, start_mesh
from tests.helpers import TIME_SCALE

pytestmark = pytest.mark.browser

# The page's calls: a weight-100 agent for query_price, sent as a page can without a preflight
# (no-cors): an untyped Blob (no Content-Type at all), a string (text/plain) and a form; and a
# typed one in cors mode (preflighted; the Router answers no CORS, so it must not get through
# either). Each settles, then the title says so.
PAGE = """<!doctype html><meta charset="utf-8"><title>loading</title><script>
const router = "ROUTER";
const profile = (id) => JSON.stringify({
  id, network: {endpoint: "http://127.0.0.1:9/reach"},
  capabilities: [{task: "query_price", routing_weight: 100}],
});
const form = new URLSearchParams({x: profile("evil-form")});
Promise.allSettled([
  fetch(router + "/agents", {method: "POST", mode: "no-cors", body: new Blob([profile("evil-untyped")])}),
  fetch(router + "/agents", {method: "POST", mode: "no-cors", body: profile("evil-text")}),
  fetch(router + "/agents", {method: "POST", mode: "no-cors", body: form}),
  fetch(router + "/agents", {method: "POST", headers: {"Content-Type": "application/json"},
                             body: profile("evil-typed")}),
  fetch(router + "/reach", {method: "POST", mode: "no-cors",
                            body: new Blob([JSON.stringify({targetTask: "query_price"})])}),
]).then(() => { document.title = "done"; });
</script>"""


@pytest.fixture
def router() -> Iterator[Mesh]:
    mesh = start_mesh(MESH_POLICY)
    try:
        yield mesh
    finally:
        mesh.bg.close()


@pytest.fixture
def evil_site(router: Mesh) -> Iterator[str]:
    """The page above, served from another origin (another loopback port)."""
    html = PAGE.replace("ROUTER", router.url).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_on_another_origin_registers_nothing(router: Mesh, evil_site: str, browser: Any) -> None:
    """The page's no-cors and preflighted calls all settle; the registry is still empty, and each
    call that reached the Router was refused and counted (none as a success)."""
    browser.get(evil_site)
    WebDriverWait(browser, 20 * TIME_SCALE, 0.05).until(lambda d: d.title == "done", "the page's calls")
    agents = httpx.get(f"{router.url}/admin/agents", timeout=10).json()
    assert agents == []
    metrics = httpx.get(f"{router.url}/metrics", timeout=10).text
    assert 'status="FORBIDDEN"' in metrics
    assert 'status="SUCCESS"' not in metrics
