"""The admin page (``GET /admin/ui``) and the one JSON view it needs beyond the admin API.

The page is three static files shipped in the package (``ui_assets/``): no build step, nothing
from a CDN, so it works offline and behind a firewall. It holds no data, so it loads without a
token; every call it makes for data goes to the admin endpoints with the admin token it keeps
for the tab. ``GET /admin/summary`` gathers the Router's own state (traffic by status over the
last minutes, retry budget, shedding, degraded mode, the policy in force) in one answer.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from reachmesh.clock import iso_utc
from reachmesh.config import RouterConfig
from reachmesh.observability.traffic import TrafficHistory, totals_by_status
from reachmesh.protocol import AgentStatusValue, Status
from reachmesh.redaction import loggable_url
from reachmesh.server.asgi import Receive, Scope, Send, error_body
from reachmesh.server.auth import UI_PATH
from reachmesh.server.components import RouterParts
from reachmesh.version import __version__

SUMMARY_PATH = "/admin/summary"

# The page runs only its own script and style, talks only to its own origin, and cannot be
# framed, re-based or made to post a form anywhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
_PAGE_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cache-control": "no-cache",
}
_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}


def _asset(name: str) -> bytes:
    return resources.files("reachmesh.server").joinpath("ui_assets", name).read_bytes()


def policy_view(config: RouterConfig) -> dict[str, Any]:
    """The policy in force as JSON, for a person to read: no token digests, no URL credentials."""
    view = config.model_dump(mode="json")
    auth = view["auth"]
    roles: dict[str, int] = {}
    for token in auth["tokens"]:
        roles[token["role"]] = roles.get(token["role"], 0) + 1
    view["auth"] = {"tokensByRole": roles, "metrics_public": auth["metrics_public"]}
    embedding = view["embedding"]
    if embedding.get("url"):
        embedding["url"] = loggable_url(embedding["url"])
    etcd = view["registry"]["etcd"]
    etcd["endpoints"] = [loggable_url(u) for u in etcd["endpoints"]]
    return view


def policy_digest(config: RouterConfig) -> str:
    """A short fingerprint of the whole policy: two Routers with the same one run the same policy."""
    canonical = orjson.dumps(config.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(canonical).hexdigest()[:16]


class AdminUi:
    """Serves the page, its two assets and ``/admin/summary``."""

    def __init__(self, parts: RouterParts) -> None:
        self.parts = parts
        self.policy = parts.policy_file
        self.started_at = parts.clock.time()
        self.traffic = TrafficHistory(lambda: totals_by_status(parts.metrics.requests.values), parts.clock)
        self._files: dict[str, bytes] = {}
        # The policy's digest and view, for the config object they were made from: a reload
        # replaces the object, so they are made again only then (dumping it costs a millisecond).
        self._policy_cache: tuple[RouterConfig, str, dict[str, Any]] | None = None
        self.app = Starlette(
            routes=[
                Route(UI_PATH, self.page, methods=["GET"]),
                Route(UI_PATH + "/", self.to_page, methods=["GET"]),
                Route(UI_PATH + "/{name}", self.asset, methods=["GET"]),
                Route(SUMMARY_PATH, self.summary, methods=["GET"]),
            ],
            exception_handlers={HTTPException: self._on_http_error},
        )
        self.app.router.redirect_slashes = False

    @staticmethod
    def serves(path: str) -> bool:
        return path in (SUMMARY_PATH, UI_PATH) or path.startswith(UI_PATH + "/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def _file(self, name: str) -> bytes:
        # Read once: the files are part of the installed package and never change under it.
        if name not in self._files:
            self._files[name] = _asset(name)
        return self._files[name]

    async def page(self, request: Request) -> Response:
        return Response(self._file("index.html"), media_type=_ASSETS["index.html"], headers=_PAGE_HEADERS)

    async def to_page(self, request: Request) -> Response:
        # The page's files are named relative to /admin/ui, so under /admin/ui/ they would not
        # load: the address a person types with a slash goes to the page. A relative Location
        # keeps working behind a proxy that serves the Router under a path prefix.
        return RedirectResponse("../ui", status_code=308)

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name == "index.html" or name not in _ASSETS:
            raise HTTPException(404, f"no such file of the admin page: {name[:64]!r}")
        return Response(self._file(name), media_type=_ASSETS[name], headers=_PAGE_HEADERS)

    async def summary(self, request: Request) -> Response:
        return Response(
            orjson.dumps(self.snapshot()),
            media_type="application/json",
            headers={"x-content-type-options": "nosniff", "cache-control": "no-store"},
        )

    def snapshot(self) -> dict[str, Any]:
        """Everything ``/admin/summary`` answers (see docs/protocol.md, "The admin page")."""
        parts = self.parts
        config = parts.config
        now = parts.clock.time()
        registry = parts.registry
        counts = dict.fromkeys((s.value for s in AgentStatusValue), 0)
        for entry in registry.agents():
            counts[entry.status.value] += 1
        totals = totals_by_status(parts.metrics.requests.values)
        return {
            "version": __version__,
            "now": iso_utc(now),
            "startedAt": iso_utc(self.started_at),
            "worker": parts.worker,
            "auth": self.parts.auth_on,
            "ready": registry.ready() or (None if self.parts.started else "starting"),
            "registry": {
                # What serves, not what the policy asked for ("auto" resolves at start).
                "backend": registry.backend,
                "degraded": registry.degraded(),
                "agents": counts,
            },
            "traffic": {
                **self.traffic.view(),
                "metricsEnabled": config.metrics.enabled,
                "totals": totals,
            },
            "retryBudget": {
                **parts.budget.snapshot(),
                "enabled": config.retry_budget.enabled,
                "ratio": config.retry_budget.ratio,
                "windowSeconds": config.retry_budget.window_seconds,
            },
            "shedding": self._shedding(totals),
            "embedding": {
                "up": None if parts.vectors is None else parts.vectors.up,
                "loading": parts.vectors is not None and parts.vectors.loading,
            },
            "policy": self._policy(),
        }

    def _shedding(self, totals: dict[str, float]) -> dict[str, Any]:
        shedder = self.parts.shedder
        limits = self.parts.config.limits
        return {
            "active": shedder.inflight >= limits.max_inflight or shedder.lag_ms >= limits.loop_lag_ms,
            "inflight": shedder.inflight,
            "maxInflight": limits.max_inflight,
            "maxInflightPerClient": limits.max_inflight_per_client,
            "loopLagMs": round(shedder.lag_ms, 2),
            "loopLagLimitMs": limits.loop_lag_ms,
            "overloadedTotal": totals.get(Status.OVERLOADED.value, 0.0),
        }

    def _policy(self) -> dict[str, Any]:
        policy = self.policy
        config = self.parts.config
        if self._policy_cache is None or self._policy_cache[0] is not config:
            self._policy_cache = (config, policy_digest(config), policy_view(config))
        _, digest, settings = self._policy_cache
        last = policy.last_reload
        return {
            "path": None if policy.path is None else str(policy.path),
            "loadedAt": iso_utc(policy.loaded_at),
            "digest": digest,
            "lastReload": None
            if last is None
            else {"at": iso_utc(last[0]), "ok": last[1], "error": None if last[1] else policy.last_error},
            "settings": settings,
        }

    async def _on_http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
        body = error_body(code, f"{request.method} {request.url.path}: {exc.detail}")
        return Response(body, status_code=exc.status_code, headers=exc.headers, media_type="application/json")


__all__ = ["CSP", "SUMMARY_PATH", "AdminUi", "policy_digest", "policy_view"]
