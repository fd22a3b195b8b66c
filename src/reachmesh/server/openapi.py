"""The OpenAPI 3.1 document of every Router endpoint, built from the wire models.

The responses of ``POST /reach`` come from the same table the Router answers with
(:data:`~reachmesh.protocol.HTTP_STATUS`) plus the door's own refusals (413, 415), so the
document cannot drift from the code.
"""

from __future__ import annotations

import copy
from typing import Any

from reachmesh.exceptions import (
    AgentIdConflict,
    AgentNotFound,
    BodyTimeout,
    InvalidProfile,
    LearningDisabled,
    LeaseMismatch,
    LeaseNotFound,
    PayloadTooLarge,
    RegistrationThrottled,
    RegistryError,
    RegistryFull,
    RegistryUnavailable,
    RequestError,
    UnsupportedMediaType,
)
from reachmesh.protocol import HTTP_STATUS, Status, json_schemas
from reachmesh.version import __version__

Operation = dict[str, Any]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_ERROR = {"type": "object", "properties": {"error": _ref("ErrorInfo")}, "required": ["error"]}
_LEARNED_BODY = {
    "type": "object",
    "properties": {"phrase": {"type": "string"}, "task": {"type": "string"}},
    "required": ["phrase", "task"],
}
_LEARNED_ROUTE = {
    "type": "object",
    "properties": {
        "phrase": {"type": "string"},
        "task": {"type": "string"},
        "source": {"type": "string", "enum": ["caller", "operator"]},
        "at": {"type": "string"},
        "declared": {"type": "boolean"},
    },
    "required": ["phrase", "task", "source", "at", "declared"],
}
_NEGATIVE = {
    "type": "object",
    "properties": {
        "phrase": {"type": "string"},
        "task": {"type": "string"},
        "source": {"type": "string", "enum": ["decline"]},
        "at": {"type": "string"},
    },
    "required": ["phrase", "task", "source", "at"],
}
_LEARNED_LIST = {
    "type": "object",
    "properties": {
        "enabled": {"type": "boolean"},
        "maxPhrases": {"type": "integer"},
        "count": {"type": "integer"},
        "pendingVectors": {"type": "integer"},
        "learned": {"type": "array", "items": _LEARNED_ROUTE},
        "negativesEnabled": {"type": "boolean"},
        "negatives": {"type": "array", "items": _NEGATIVE},
    },
    "required": ["enabled", "maxPhrases", "count", "pendingVectors", "learned", "negatives"],
}
_LEASE_BODY = {"type": "object", "properties": {"leaseId": {"type": "string"}}, "required": ["leaseId"]}

# How a request body is refused before its endpoint reads it (http.read_body and the JSON
# checks): a body that is not JSON or lacks a field (400), too slow (408), too big (413), or
# declared as something other than JSON (415).
_BODY_REFUSALS: tuple[type[RequestError], ...] = (
    RequestError,
    BodyTimeout,
    PayloadTooLarge,
    UnsupportedMediaType,
)


def _reach_statuses(*, door: bool) -> dict[int, list[str]]:
    by_code: dict[int, list[str]] = {}
    for status, code in HTTP_STATUS.items():
        if status is not Status.DECLINED:  # an agent's answer to the Router, never the Router's
            by_code.setdefault(code, []).append(status.value)
    if door:
        for error in _BODY_REFUSALS[1:]:
            by_code.setdefault(error.http_status, []).append(f"INVALID_REQUEST ({error.code})")
    return by_code


def reach_responses(*, door: bool = True) -> dict[str, Any]:
    """Every HTTP status ``POST /reach`` answers with, each a ReachResponse, named by status.

    ``door``: with the refusals of a request's body (408, 413, 415), which only ``POST /reach``
    itself answers; a stored async result has none of them.
    """
    return {
        str(code): _json(_ref("ReachResponse"), " or ".join(names))
        for code, names in sorted(_reach_statuses(door=door).items())
    }


def error_responses(*errors: type[RequestError | RegistryError], body: bool = False) -> dict[str, Any]:
    """The ``{"error": ...}`` answers of a registry or admin endpoint, by HTTP code, named by code.

    ``body``: the endpoint reads a JSON body, so it also answers the body refusals.
    """
    by_code: dict[int, list[str]] = {}
    for error in (*_BODY_REFUSALS, *errors) if body else errors:
        by_code.setdefault(error.http_status, []).append(error.code)
    return {str(code): _json(_ERROR, " or ".join(codes)) for code, codes in sorted(by_code.items())}


def _op(path: str, method: str) -> str:
    """An operationRef (JSON pointer) to ``method`` of ``path``."""
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method


def _linked(response: dict[str, Any], **links: dict[str, Any]) -> dict[str, Any]:
    """``response`` with OpenAPI links: what a client (or a stateful fuzzer) may call next with it."""
    return {**response, "links": links}


def _reach_paths() -> dict[str, Operation]:
    responses = reach_responses()
    # An accepted async request is polled by its traceId.
    responses["202"] = _linked(
        responses["202"],
        pollResult={
            "operationRef": _op("/reach/{trace_id}", "get"),
            "parameters": {"trace_id": "$response.body#/traceId"},
        },
    )
    return {
        "/reach": {
            "post": {
                "summary": "Send one ReachRequest; get one ReachResponse",
                "requestBody": {"required": True, **_json(_ref("ReachRequest"), "the envelope")},
                "responses": responses,
            }
        },
        "/reach/{trace_id}": {
            "get": {
                "summary": "The outcome of an async request: 202 while pending, then the ReachResponse",
                "parameters": [_path_param("trace_id")],
                # A finished request answers with its status's own code, as POST /reach would have.
                "responses": {
                    **reach_responses(door=False),
                    "202": _json(_ref("ReachResponse"), "ACCEPTED: still running"),
                    "404": _json(_ERROR, "NOT_FOUND: unknown or expired"),
                },
            }
        },
    }


# A registration's agentId and leaseId are what renewal, deregistration and the status view take.
_AGENT_ID = "$response.body#/agentId"
_LEASE_ID = "$response.body#/leaseId"
_REGISTRATION_LINKS: dict[str, dict[str, Any]] = {
    "renewLease": {
        "operationRef": _op("/agents/{agent_id}/lease", "put"),
        "parameters": {"agent_id": _AGENT_ID},
        "requestBody": {"leaseId": _LEASE_ID},
    },
    "deregister": {
        "operationRef": _op("/agents/{agent_id}", "delete"),
        "parameters": {"agent_id": _AGENT_ID, "header.X-Reach-Lease": _LEASE_ID},
    },
    "agentStatus": {
        "operationRef": _op("/admin/agents/{agent_id}", "get"),
        "parameters": {"agent_id": _AGENT_ID},
    },
}


def _registry_paths() -> dict[str, Operation]:
    return {
        "/agents": {
            "post": {
                "summary": (
                    "Register an agent profile (with leaseId, or the same instanceId and endpoint: "
                    "replace it in place, same lease)"
                ),
                "requestBody": {"required": True, **_json(_ref("AgentProfile"), "the profile")},
                "responses": {
                    "201": _linked(_json(_ref("Registration"), "registered"), **_REGISTRATION_LINKS),
                    "200": _linked(
                        _json(_ref("Registration"), "replaced in place, or a retry answered with its lease"),
                        **_REGISTRATION_LINKS,
                    ),
                    **error_responses(
                        AgentIdConflict, InvalidProfile, RegistrationThrottled, RegistryFull, body=True
                    ),
                },
            }
        },
        "/agents/{agent_id}/lease": {
            "put": {
                "summary": "Renew a lease",
                "parameters": [_path_param("agent_id")],
                "requestBody": {"required": True, **_json(_LEASE_BODY, "the lease")},
                "responses": {
                    "200": _json(_ref("Lease"), "renewed"),
                    **error_responses(LeaseMismatch, LeaseNotFound, body=True),
                },
            }
        },
        "/agents/{agent_id}": {
            "delete": {
                "summary": "Deregister (body {leaseId} or header X-Reach-Lease)",
                "parameters": [
                    _path_param("agent_id"),
                    {
                        "name": "X-Reach-Lease",
                        "in": "header",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                ],
                # Without the header, the lease is read from a JSON body.
                "responses": {
                    "204": {"description": "deregistered"},
                    **error_responses(LeaseMismatch, AgentNotFound, body=True),
                },
            }
        },
    }


_SCHEMA_OR_NULL: dict[str, Any] = {"anyOf": [{"type": "object"}, {"type": "null"}]}
_CAPABILITY_ROW: dict[str, Any] = {
    "type": "object",
    "required": ["task", "description", "examples", "inputSchema", "outputSchema", "agents"],
    "properties": {
        "task": {"type": "string"},
        "description": {"type": "string"},
        "examples": {"type": "array", "items": {"type": "string"}},
        "inputSchema": _SCHEMA_OR_NULL,
        "outputSchema": _SCHEMA_OR_NULL,
        "agents": {"type": "array", "items": {"type": "string"}},
    },
}


_TRACE_LIMIT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": 1000}
# A data table, built once: openapi_document() copies it before declaring security on it.
_ADMIN_PATHS: dict[str, Operation] = {
    "/admin/agents": {
        "get": {
            "summary": "Every registered agent",
            "responses": {"200": _json({"type": "array", "items": _ref("AgentStatus")}, "agents")},
        }
    },
    "/admin/agents/{agent_id}": {
        "get": {
            "summary": "One registered agent",
            "parameters": [_path_param("agent_id")],
            "responses": {
                "200": _json(_ref("AgentStatus"), "the agent"),
                "404": _json(_ERROR, "AGENT_NOT_FOUND"),
            },
        }
    },
    "/admin/capabilities": {
        "get": {
            "summary": "Every routable task: description, examples, JSON Schemas, agents (for bridges)",
            "responses": {"200": _json({"type": "array", "items": _CAPABILITY_ROW}, "capabilities")},
        }
    },
    "/admin/traces": {
        "get": {
            "summary": "Recent hops, newest first",
            "parameters": [
                {"name": "task", "in": "query", "required": False, "schema": {"type": "string"}},
                {"name": "status", "in": "query", "required": False, "schema": {"type": "string"}},
                {"name": "limit", "in": "query", "required": False, "schema": _TRACE_LIMIT},
            ],
            "responses": {"200": {"description": "trace summaries"}, "400": _json(_ERROR, "a bad limit")},
        }
    },
    "/admin/traces/{trace_id}": {
        "get": {
            "summary": "Every hop of one trace, and their tree",
            "parameters": [_path_param("trace_id")],
            "responses": {"200": {"description": "the trace"}, "404": _json(_ERROR, "TRACE_NOT_FOUND")},
        }
    },
    "/admin/learned": {
        "get": {
            "summary": "Learned routes (routing.learning), newest first",
            "responses": {"200": _json(_LEARNED_LIST, "the learned routes and the policy")},
        },
        "post": {
            "summary": "Confirm a route: remember a phrase for a declared task (needs learning on)",
            "requestBody": {"required": True, **_json(_LEARNED_BODY, "the phrase and its task")},
            "responses": {
                "201": _json(_LEARNED_ROUTE, "remembered (a newer confirmation replaces an older one)"),
                **error_responses(LearningDisabled, RegistryUnavailable, body=True),
            },
        },
        "delete": {
            "summary": "Forget a learned phrase (matched normalized)",
            "parameters": [{"name": "phrase", "in": "query", "required": True, "schema": {"type": "string"}}],
            "responses": {
                "204": {"description": "forgotten"},
                "400": _json(_ERROR, "no phrase given"),
                "404": _json(_ERROR, "NOT_FOUND: no learned route for that phrase"),
                **error_responses(RegistryUnavailable),
            },
        },
    },
    "/admin/learned/negatives": {
        "delete": {
            "summary": "Forget a learned negative: offer the phrase to the task by meaning again",
            "parameters": [
                {"name": "phrase", "in": "query", "required": True, "schema": {"type": "string"}},
                {"name": "task", "in": "query", "required": True, "schema": {"type": "string"}},
            ],
            "responses": {
                "204": {"description": "forgotten"},
                "400": _json(_ERROR, "no phrase or no task given"),
                "404": _json(_ERROR, "NOT_FOUND: no learned negative for that phrase and task"),
                **error_responses(RegistryUnavailable),
            },
        },
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
}


def _public_paths() -> dict[str, Operation]:
    def simple(summary: str, **responses: str) -> Operation:
        return {
            "get": {
                "summary": summary,
                "responses": {c[1:]: {"description": d} for c, d in responses.items()},
            }
        }

    return {
        "/metrics": simple("Prometheus metrics", _200="text format"),
        "/healthz": simple("Liveness", _200="serving"),
        "/readyz": simple("Readiness", _200="ready to route", _503="not ready, with the reason"),
        "/openapi.json": simple("This document", _200="OpenAPI"),
    }


def _admin_page_paths() -> dict[str, Operation]:
    """The admin page (open: it holds no data) and the summary it reads (admin, as all /admin)."""
    page = {"description": "the page", "content": {"text/html": {"schema": {"type": "string"}}}}
    return {
        "/admin/ui": {
            "get": {
                "summary": "The admin page (HTML); its calls for data carry an admin token",
                "responses": {"200": page},
            }
        },
        "/admin/summary": {
            "get": {
                "summary": "The Router's own state for the admin page: traffic by status over the last "
                "minutes, retry budget, shedding, degraded mode, the policy in force",
                "responses": {"200": {"description": "the summary"}},
            }
        },
    }


# Open to everyone whatever the policy; /metrics is open when auth.metrics_public says so.
_OPEN_PATHS = {"/healthz", "/readyz", "/openapi.json", "/admin/ui"}


def _declare_security(paths: dict[str, Operation]) -> None:
    """Bearer tokens where the Router checks them once auth is on ({}: auth may be off)."""
    for path, operations in paths.items():
        if path in _OPEN_PATHS:
            continue
        for operation in operations.values():
            operation["security"] = [{"bearer": []}, {}]
            responses = operation["responses"]
            if path != "/reach" and not path.startswith("/reach/"):
                responses.setdefault("401", _json(_ERROR, "UNAUTHORIZED: no token, or an unknown one"))
                responses.setdefault(
                    "403", _json(_ERROR, "FORBIDDEN: the token's role or globs do not allow it")
                )
            else:
                responses.setdefault("401", _json(_ref("ReachResponse"), "UNAUTHORIZED"))
                responses.setdefault("403", _json(_ref("ReachResponse"), "FORBIDDEN"))


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document served at ``GET /openapi.json``."""
    schemas: dict[str, Any] = {}
    for name, schema in json_schemas().items():
        # Lift nested $defs to components so every $ref resolves in one place.
        for sub, sub_schema in schema.pop("$defs", {}).items():
            schemas[sub] = sub_schema
        schemas[name] = schema
    paths = {
        **_reach_paths(),
        **_registry_paths(),
        **copy.deepcopy(_ADMIN_PATHS),
        **_admin_page_paths(),
        **_public_paths(),
    }
    _declare_security(paths)
    document = {
        "openapi": "3.1.0",
        "info": {"title": "Agent-Reach Router", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
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
