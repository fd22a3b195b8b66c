"""The OpenAPI document is generated from the status table the Router answers with."""

from __future__ import annotations

from reachmesh.protocol import HTTP_STATUS, Status
from reachmesh.server.openapi import openapi_document

# Every status the Router answers with: DECLINED is an agent's answer to the Router, never its own.
ROUTER_STATUS = {status: code for status, code in HTTP_STATUS.items() if status is not Status.DECLINED}


def test_reach_declares_every_status_the_router_answers_with() -> None:
    """POST /reach lists each ReachResponse status under its HTTP code, 202, 429 and 500 included."""
    responses = openapi_document()["paths"]["/reach"]["post"]["responses"]
    for status, code in ROUTER_STATUS.items():
        assert status.value in responses[str(code)]["description"], status
    assert "DECLINED" not in str(responses)
    assert {"202", "413", "415", "429", "500"} <= set(responses)


def test_every_ref_resolves() -> None:
    """Each $ref in the document points at a schema under components."""
    document = openapi_document()
    names = set(document["components"]["schemas"])

    def refs(node: object) -> list[str]:
        if isinstance(node, dict):
            return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in refs(v)]
        if isinstance(node, list):
            return [r for v in node for r in refs(v)]
        return []

    for ref in refs(document):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in names, ref


def test_an_async_result_may_carry_any_reach_status() -> None:
    """GET /reach/{trace_id} declares every status code a stored async result is answered with."""
    responses = openapi_document()["paths"]["/reach/{trace_id}"]["get"]["responses"]
    assert {str(code) for code in ROUTER_STATUS.values()} | {"404"} <= set(responses)


def test_registry_endpoints_declare_their_body_refusals() -> None:
    """Endpoints that read a JSON body declare 400, 408, 413 and 415; registration also 503 REGISTRY_FULL."""
    paths = openapi_document()["paths"]
    for path, method in (
        ("/agents", "post"),
        ("/agents/{agent_id}/lease", "put"),
        ("/agents/{agent_id}", "delete"),
    ):
        assert {"400", "408", "413", "415"} <= set(paths[path][method]["responses"]), path
    assert "REGISTRY_FULL" in paths["/agents"]["post"]["responses"]["503"]["description"]
