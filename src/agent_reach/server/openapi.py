"""The OpenAPI 3.1 document of every Router endpoint, built from the wire models."""

from __future__ import annotations

from typing import Any

from agent_reach import __version__
from agent_reach.protocol import json_schemas


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR = {
    "type": "object",
    "properties": {"error": _ref("ErrorInfo")},
    "required": ["error"],
}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document served at ``GET /openapi.json``."""
    schemas: dict[str, Any] = {}
    for name, schema in json_schemas().items():
        # Lift nested $defs to components so every $ref resolves in one place.
        for sub, sub_schema in schema.pop("$defs", {}).items():
            schemas[sub] = sub_schema
        schemas[name] = schema
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Agent-Reach Router", "version": __version__},
        "paths": {
            "/reach": {
                "post": {
                    "summary": "Send one ReachRequest; get one ReachResponse",
                    "requestBody": {"required": True, **_json(_ref("ReachRequest"), "the envelope")},
                    "responses": {
                        str(code): _json(_ref("ReachResponse"), text)
                        for code, text in [
                            (200, "SUCCESS"),
                            (400, "INVALID_REQUEST"),
                            (409, "CONTEXT_UNAVAILABLE"),
                            (413, "PAYLOAD_TOO_LARGE"),
                            (415, "UNSUPPORTED_MEDIA_TYPE"),
                            (502, "AGENT_ERROR"),
                            (503, "NO_AVAILABLE_HANDLER"),
                            (504, "TIMEOUT"),
                        ]
                    },
                }
            },
            "/agents": {
                "post": {
                    "summary": "Register an agent profile (with leaseId: replace it in place)",
                    "requestBody": {"required": True, **_json(_ref("AgentProfile"), "the profile")},
                    "responses": {
                        "201": _json(_ref("Registration"), "registered"),
                        "200": _json(_ref("Registration"), "replaced in place"),
                        "409": _json(_ERROR, "AGENT_ID_CONFLICT"),
                        "422": _json(_ERROR, "INVALID_PROFILE, with the field paths"),
                    },
                }
            },
            "/agents/{agent_id}/lease": {
                "put": {
                    "summary": "Renew a lease",
                    "parameters": [
                        {"name": "agent_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "requestBody": {
                        "required": True,
                        **_json(
                            {
                                "type": "object",
                                "properties": {"leaseId": {"type": "string"}},
                                "required": ["leaseId"],
                            },
                            "the lease",
                        ),
                    },
                    "responses": {
                        "200": _json(_ref("Lease"), "renewed"),
                        "403": _json(_ERROR, "FORBIDDEN: not this agent's lease"),
                        "404": _json(_ERROR, "LEASE_NOT_FOUND: register again"),
                    },
                }
            },
            "/agents/{agent_id}": {
                "delete": {
                    "summary": "Deregister (body {leaseId} or header X-Reach-Lease)",
                    "parameters": [
                        {"name": "agent_id", "in": "path", "required": True, "schema": {"type": "string"}},
                        {
                            "name": "X-Reach-Lease",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string"},
                        },
                    ],
                    "responses": {
                        "204": {"description": "deregistered"},
                        "403": _json(_ERROR, "FORBIDDEN: not this agent's lease"),
                        "404": _json(_ERROR, "AGENT_NOT_FOUND"),
                    },
                }
            },
            "/admin/agents": {
                "get": {
                    "summary": "Every registered agent",
                    "responses": {"200": _json({"type": "array", "items": _ref("AgentStatus")}, "agents")},
                }
            },
            "/admin/agents/{agent_id}": {
                "get": {
                    "summary": "One registered agent",
                    "parameters": [
                        {"name": "agent_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": _json(_ref("AgentStatus"), "the agent"),
                        "404": _json(_ERROR, "AGENT_NOT_FOUND"),
                    },
                }
            },
            "/reach/{trace_id}": {
                "get": {
                    "summary": "The outcome of an async request: 202 while pending, then the ReachResponse",
                    "parameters": [
                        {"name": "trace_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": _json(_ref("ReachResponse"), "finished (or the status's own code)"),
                        "202": _json(_ref("ReachResponse"), "ACCEPTED: still running"),
                        "404": _json(_ERROR, "unknown or expired"),
                    },
                }
            },
            "/admin/traces": {
                "get": {
                    "summary": "Recent hops, newest first",
                    "parameters": [
                        {"name": "task", "in": "query", "required": False, "schema": {"type": "string"}},
                        {"name": "status", "in": "query", "required": False, "schema": {"type": "string"}},
                        {
                            "name": "limit",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                        },
                    ],
                    "responses": {"200": {"description": "trace summaries"}},
                }
            },
            "/admin/traces/{trace_id}": {
                "get": {
                    "summary": "Every hop of one trace, and their tree",
                    "parameters": [
                        {"name": "trace_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": {
                        "200": {"description": "the trace"},
                        "404": _json(_ERROR, "TRACE_NOT_FOUND"),
                    },
                }
            },
            "/admin/reload": {
                "post": {
                    "summary": "Re-read the policy file (as SIGHUP does)",
                    "responses": {
                        "200": {"description": "reloaded"},
                        "409": _json(_ERROR, "no policy file"),
                        "422": _json(_ERROR, "invalid new policy; the old one is kept"),
                    },
                }
            },
            "/metrics": {
                "get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text format"}}}
            },
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "serving"}}}},
            "/readyz": {
                "get": {
                    "summary": "Readiness",
                    "responses": {
                        "200": {"description": "ready to route"},
                        "503": {"description": "not ready, with the reason"},
                    },
                }
            },
            "/openapi.json": {
                "get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI"}}}
            },
        },
        "components": {"schemas": schemas},
    }
    # pydantic writes refs as #/$defs/X; point them at components.
    rewritten: dict[str, Any] = _rewrite_refs(document)
    return rewritten


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (
                v.replace("#/$defs/", "#/components/schemas/")
                if k == "$ref" and isinstance(v, str)
                else _rewrite_refs(v)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node
