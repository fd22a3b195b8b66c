"""A page on an origin listed in server.allowed_origins, in a real headless Chromium, calls the
Router with JSON and reads its answer (the Router answers the preflight and names the origin);
the same page from an origin not listed gets nothing through."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from selenium.webdriver.support.ui import WebDriverWait

from reachmesh.config import RouterConfig
from reachmesh.testing import BackgroundLoop, FakeAgent, RouterServer, free_port
from tests.helpers import TIME_SCALE
from tests.streaming_agents import Conn, StreamAgent

pytestmark = pytest.mark.browser

# Two calls as a page makes them: typed JSON with a trace header (both need the preflight), one
# answered, one refused 503 with a Retry-After (a header a page may read only when exposed).
PAGE = """<!doctype html><meta charset="utf-8"><title>loading</title><script>
const router = "ROUTER";
async function call(task, headers) {
  try {
    const resp = await fetch(router + "/reach", {
      method: "POST",
      headers: {"Content-Type": "application/json", ...headers},
      body: JSON.stringify({targetTask: task, payload: {product_id: "SKU-1"}}),
    });
    const body = await resp.json();
    return {http: resp.status, status: body.status, result: body.result, traceId: body.traceId,
            retryAfter: resp.headers.get("Retry-After")};
  } catch (error) {
    return {error: String(error)};
  }
}
(async () => {
  window.outcome = {
    quote: await call("quote_price", {"X-Reach-Trace-Id": "page-call-1"}),
    busy: await call("busy_task", {}),
  };
  document.title = "done";
})();
</script>"""


@dataclass
class CorsMesh:
    bg: BackgroundLoop
    router: RouterServer
    quote: FakeAgent
    page_port: int


async def _busy(conn: Conn) -> None:
    """Every call: 429 with a Retry-After, which the Router passes on as its 503's."""
    body = b'{"status":"AGENT_ERROR","error":{"code":"AGENT_BUSY","message":"busy","retryable":true}}'
    await conn.write(
        b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 7\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    conn.writer.close()


@pytest.fixture
def cors_mesh() -> Iterator[CorsMesh]:
    """The page's server (one port: its origin is http://127.0.0.1:PORT, listed, and
    http://localhost:PORT, not listed), a Router listing that one origin, and two agents."""
    page: dict[str, bytes] = {}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            html = page["html"]
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
    port = server.server_address[1]
    policy = {
        "embedding": {"backend": "none"},
        "health": {"enabled": False},
        "limits": {"loop_lag_ms": 10_000},
        "server": {"allowed_origins": [f"http://127.0.0.1:{port}"]},
    }
    bg = BackgroundLoop()
    router = RouterServer(RouterConfig.from_mapping(policy))
    quote = FakeAgent("quote-agent", tasks=("quote_price",), result={"price": 199.9})
    busy = StreamAgent("busy-agent", _busy, task="busy_task")
    try:
        bg.run(router.__aenter__())
        bg.on_close(lambda: router.__aexit__(None, None, None))
        bg.run(quote.start())
        bg.on_close(quote.stop)
        bg.run(quote.register(router.url, vectors=False))
        bg.run(busy.start())
        bg.on_close(busy.stop)
        bg.run(busy.register(router.url))
        page["html"] = PAGE.replace("ROUTER", router.url).encode()
        yield CorsMesh(bg, router, quote, port)
    finally:
        bg.close()
        server.shutdown()
        server.server_close()


def outcome(browser: Any, url: str) -> dict[str, Any]:
    browser.get(url)
    WebDriverWait(browser, 20 * TIME_SCALE, 0.05).until(lambda d: d.title == "done", "the page's calls")
    found: dict[str, Any] = browser.execute_script("return window.outcome")
    return found


def test_a_page_on_a_listed_origin_calls_and_reads_the_answer(cors_mesh: CorsMesh, browser: Any) -> None:
    seen = outcome(browser, f"http://127.0.0.1:{cors_mesh.page_port}/")
    assert seen["quote"] == {
        "http": 200,
        "status": "SUCCESS",
        "result": {"price": 199.9},
        "traceId": "page-call-1",  # the X-Reach-Trace-Id the preflight let the page send
        "retryAfter": None,
    }
    busy = seen["busy"]
    assert (busy["http"], busy["status"]) == (503, "NO_AVAILABLE_HANDLER"), busy
    assert busy["retryAfter"] == "7"  # an exposed header: the page may read it
    assert len(cors_mesh.quote.received) == 1


def test_the_same_page_on_an_origin_not_listed_gets_nothing(cors_mesh: CorsMesh, browser: Any) -> None:
    seen = outcome(browser, f"http://localhost:{cors_mesh.page_port}/")
    assert "error" in seen["quote"] and "error" in seen["busy"], seen
    assert cors_mesh.quote.received == []  # refused at the preflight: the call never went out
