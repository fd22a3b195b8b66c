"""The registry API and the admin surface (PROTOCOL.md §2 and §4), as a Starlette app."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_reach.exceptions import InvalidProfile, RegistryError, RequestError
from agent_reach.protocol import AgentProfile, error_details
from agent_reach.server.http import check_json_content_type, error_body, read_body
from agent_reach.server.openapi import openapi_document

if TYPE_CHECKING:
    from agent_reach.server.app import RouterApp


class _Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else orjson.dumps(content)


def _error(status: int, code: str, message: str, details: Any = None) -> _Json:
    return _Json(error_body(code, message, details=details), status_code=status)


def build_admin(router: RouterApp) -> Starlette:
    """The Starlette app for every endpoint but the ``POST /reach`` hot path."""

    async def read_json(request: Request) -> Any:
        headers = {k.lower().encode("latin-1"): v.encode("latin-1") for k, v in request.headers.items()}
        check_json_content_type(headers)
        body = await read_body(request.receive, headers, router.config.server.body_limit_bytes)
        if not body:
            return None
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise RequestError(f"body is not valid JSON: {exc.msg}") from exc

    async def register(request: Request) -> Response:
        data = await read_json(request)
        if not isinstance(data, dict):
            raise InvalidProfile(
                "the body must be a JSON object: the mapping under `agent:`",
                details=[{"field": "(body)", "message": "expected an object"}],
            )
        lease_id = data.get("leaseId")
        if lease_id is not None and not isinstance(lease_id, str):
            raise InvalidProfile(
                "leaseId must be a string", details=[{"field": "leaseId", "message": "expected a string"}]
            )
        try:
            profile = AgentProfile.model_validate(data)
        except ValidationError as exc:
            details = error_details(exc)
            raise InvalidProfile(
                "invalid agent profile: " + ", ".join(d["field"] for d in details), details=details
            ) from exc
        entry, created = await router.registry.register(profile, lease_id=lease_id)
        if router.vectors is not None:
            # Capability vectors are computed here, once, never on a request. If the embedder is
            # down the agent is still registered (exact match serves it) and retried later.
            await router.vectors.add(entry)
        return _Json(
            {
                "agentId": entry.id,
                "leaseId": entry.lease_id,
                "ttlSeconds": entry.ttl_seconds,
                "status": entry.status.value,
            },
            status_code=201 if created else 200,
        )

    async def renew(request: Request) -> Response:
        data = await read_json(request)
        lease_id = data.get("leaseId") if isinstance(data, dict) else None
        if not isinstance(lease_id, str):
            raise RequestError(
                'the body must be {"leaseId": "..."}',
                details=[{"field": "leaseId", "message": "required string"}],
            )
        entry = await router.registry.renew(request.path_params["agent_id"], lease_id)
        return _Json({"agentId": entry.id, "leaseId": entry.lease_id, "ttlSeconds": entry.ttl_seconds})

    async def deregister(request: Request) -> Response:
        lease_id = request.headers.get("x-reach-lease")
        if lease_id is None:
            data = await read_json(request)
            lease_id = data.get("leaseId") if isinstance(data, dict) else None
        if not isinstance(lease_id, str):
            raise RequestError(
                'give the lease as {"leaseId": "..."} or the X-Reach-Lease header',
                details=[{"field": "leaseId", "message": "required string"}],
            )
        await router.registry.deregister(request.path_params["agent_id"], lease_id)
        return Response(status_code=204)

    async def list_agents(request: Request) -> Response:
        entries = sorted(router.registry.agents(), key=lambda e: e.id)
        return _Json([router.agent_status(e) for e in entries])

    async def get_agent(request: Request) -> Response:
        entry = router.registry.get(request.path_params["agent_id"])
        if entry is None:
            return _error(404, "AGENT_NOT_FOUND", f"no agent {request.path_params['agent_id']!r}")
        return _Json(router.agent_status(entry))

    async def healthz(request: Request) -> Response:
        return _Json({"status": "ok"})

    async def readyz(request: Request) -> Response:
        reason = router.registry.ready() or (None if router.started else "starting")
        if reason is not None:
            return _Json({"status": "not_ready", "reason": reason}, status_code=503)
        return _Json({"status": "ready"})

    document: dict[str, Any] = {}

    async def openapi(request: Request) -> Response:
        if not document:
            document.update(openapi_document())
        return _Json(document)

    async def async_result(request: Request) -> Response:
        trace_id = request.path_params["trace_id"]
        reply = router.results.get(trace_id)
        if reply is not None:
            return _Json(reply[1], status_code=reply[0])
        if router.results.is_pending(trace_id):
            return _Json(
                {
                    "version": "1.0",
                    "traceId": trace_id,
                    "status": "ACCEPTED",
                    "handlerAgentId": None,
                    "durationMs": 0,
                    "result": None,
                    "error": None,
                    "attempts": [],
                },
                status_code=202,
            )
        return _error(404, "NOT_FOUND", f"no async request {trace_id!r} (unknown, or its result expired)")

    async def metrics(request: Request) -> Response:
        from agent_reach.observability.metrics import CONTENT_TYPE

        return Response(router.metrics.exposition(), media_type=CONTENT_TYPE)

    async def get_trace(request: Request) -> Response:
        trace = router.traces.trace(request.path_params["trace_id"])
        if trace is None:
            return _error(
                404,
                "TRACE_NOT_FOUND",
                f"no trace {request.path_params['trace_id']!r} (unknown, or evicted from the store)",
            )
        return _Json(trace)

    async def list_traces(request: Request) -> Response:
        raw_limit = request.query_params.get("limit", "50")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 1000:
            raise RequestError(
                "limit must be a whole number from 1 to 1000",
                details=[{"field": "limit", "message": "1..1000"}],
            )
        found = router.traces.recent(
            task=request.query_params.get("task") or None,
            status=request.query_params.get("status") or None,
            limit=int(raw_limit),
        )
        return _Json(found)

    async def reload(request: Request) -> Response:
        if router.config_path is None:
            return _error(409, "NO_POLICY_FILE", "the Router was started without a policy file")
        if not router.reload():
            return _error(
                422, "INVALID_CONFIG", "the new policy file is invalid; the old one is kept (see log)"
            )
        return _Json({"status": "reloaded", "path": str(router.config_path)})

    async def on_registry_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RegistryError)
        return _error(exc.http_status, exc.code, exc.message, exc.details)

    async def on_request_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError)
        return _error(exc.http_status, exc.code, exc.message, exc.details)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return _error(exc.status_code, code, message)

    routes = [
        Route("/agents", register, methods=["POST"]),
        Route("/agents/{agent_id}/lease", renew, methods=["PUT"]),
        Route("/agents/{agent_id}", deregister, methods=["DELETE"]),
        Route("/admin/agents", list_agents, methods=["GET"]),
        Route("/admin/agents/{agent_id}", get_agent, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/reach/{trace_id}", async_result, methods=["GET"]),
        Route("/admin/traces", list_traces, methods=["GET"]),
        Route("/admin/traces/{trace_id}", get_trace, methods=["GET"]),
        Route("/admin/reload", reload, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={
            RegistryError: on_registry_error,
            RequestError: on_request_error,
            HTTPException: on_http_error,
        },
    )


__all__ = ["build_admin"]
