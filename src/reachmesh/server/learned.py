"""The learned routes and negatives, as an operator lists, confirms and forgets them.

:class:`LearnedRoutes` serves ``/admin/learned`` and ``/admin/learned/negatives`` for the
:class:`~reachmesh.server.admin.AdminApi`, which holds it and reads request bodies for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reachmesh.clock import iso_utc
from reachmesh.exceptions import LearningDisabled, RequestError
from reachmesh.registry.base import LearnedRoute, normalize_phrase
from reachmesh.server.components import RouterParts
from reachmesh.server.responses import JsonResponse, json_error


class LearnedRoutes:
    """The ``/admin/learned`` endpoints, over the registry's learned routes and negatives."""

    def __init__(self, parts: RouterParts, read_json: Callable[[Request], Awaitable[Any]]) -> None:
        self.parts = parts
        self._read_json = read_json

    def routes(self) -> list[Route]:
        return [
            Route("/admin/learned", self.list_learned, methods=["GET"]),
            Route("/admin/learned", self.confirm_learned, methods=["POST"]),
            Route("/admin/learned", self.forget_learned, methods=["DELETE"]),
            Route("/admin/learned/negatives", self.forget_negative, methods=["DELETE"]),
        ]

    def _learned_view(self, route: LearnedRoute) -> dict[str, Any]:
        return {
            **route.to_json(),
            "at": iso_utc(route.at),
            # False: no agent declares the task now; the route is kept, and unused until one does.
            "declared": bool(self.parts.registry.by_task(route.task)),
        }

    def _negative_view(self, negative: LearnedRoute) -> dict[str, Any]:
        view: dict[str, Any] = {**negative.to_json(), "at": iso_utc(negative.at)}
        if negative.expires is not None:
            view["expires"] = iso_utc(negative.expires)
        entry = self.parts.registry.get(negative.agent or "")
        # False: that agent left, or registered afresh since; the negative no longer applies.
        view["applies"] = entry is not None and entry.lease_tag == negative.lease
        return view

    async def list_learned(self, request: Request) -> Response:
        policy = self.parts.config.routing.learning
        routes = sorted(self.parts.registry.learned().values(), key=lambda r: -r.at)
        now = self.parts.clock.time()
        # An expired negative applies to nobody: it is not shown (etcd removes it at its TTL).
        negatives = [n for n in self.parts.registry.negatives().values() if n.live(now)]
        vectors = self.parts.vectors
        return JsonResponse(
            {
                "enabled": policy.enabled,
                "maxPhrases": policy.max_phrases,
                "count": len(routes),
                # Learned phrases whose example row is still being embedded (0 without an embedder).
                "pendingVectors": 0 if vectors is None else vectors.learned_pending(),
                "learned": [self._learned_view(r) for r in routes],
                # (phrase, task) pairs routes by meaning keep apart: that task declined that phrase.
                "negativesEnabled": policy.negatives,
                "scope": policy.scope,
                "negativeTtlSeconds": policy.negative_ttl_seconds,
                "negatives": [self._negative_view(n) for n in sorted(negatives, key=lambda r: -r.at)],
            }
        )

    async def confirm_learned(self, request: Request) -> Response:
        """An operator confirms ``phrase`` -> ``task`` (the second way a route is confirmed)."""
        data = await self._read_json(request)
        phrase = data.get("phrase") if isinstance(data, dict) else None
        task = data.get("task") if isinstance(data, dict) else None
        faults = []
        if not isinstance(phrase, str) or not _printable_text(phrase) or not normalize_phrase(phrase):
            faults.append({"field": "phrase", "message": "a printable string of 1 to 1024 characters"})
        if not isinstance(task, str) or not task:
            faults.append({"field": "task", "message": "a declared task name"})
        if faults:
            raise RequestError(
                'the body must be {"phrase": "...", "task": "..."}: ' + ", ".join(f["field"] for f in faults),
                details=faults,
            )
        assert isinstance(phrase, str) and isinstance(task, str)
        policy = self.parts.config.routing.learning
        if not policy.enabled:
            raise LearningDisabled("learning is off: set routing.learning.enabled to true first")
        if not self.parts.registry.by_task(task):
            # A typo would otherwise be kept and silently never used.
            raise RequestError(
                f"no agent declares task {task!r}",
                details=[{"field": "task", "message": "no agent declares it"}],
            )
        route = LearnedRoute(phrase, task, "operator", self.parts.clock.time(), by="operator")
        await self.parts.registry.remember(route, limit=policy.max_phrases)
        return JsonResponse(self._learned_view(route), status_code=201)

    async def forget_learned(self, request: Request) -> Response:
        phrase, owner = request.query_params.get("phrase"), request.query_params.get("owner")
        if not phrase:
            raise RequestError(
                "give the phrase to forget: DELETE /admin/learned?phrase=...[&owner=...]",
                details=[{"field": "phrase", "message": "required"}],
            )
        if not await self.parts.registry.forget(phrase, owner or None):
            return json_error(404, "NOT_FOUND", "no learned route for that phrase")
        return Response(status_code=204)

    async def forget_negative(self, request: Request) -> Response:
        phrase, task = request.query_params.get("phrase"), request.query_params.get("task")
        if not phrase or not task:
            raise RequestError(
                "give the phrase and the task: "
                "DELETE /admin/learned/negatives?phrase=...&task=...[&agent=...]",
                details=[
                    {"field": f, "message": "required"}
                    for f, v in (("phrase", phrase), ("task", task))
                    if not v
                ],
            )
        agent = request.query_params.get("agent") or None
        if not await self.parts.registry.forget_negative(phrase, task, agent):
            return json_error(404, "NOT_FOUND", "no learned negative for that phrase and task")
        return Response(status_code=204)


def _printable_text(text: str) -> bool:
    """As a ReachRequest's ``targetTask``: 1 to 1024 characters, no control characters."""
    return 0 < len(text) <= 1024 and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


__all__ = ["LearnedRoutes"]
