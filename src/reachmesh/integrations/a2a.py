"""The A2A bridge, both ways (A2A 1.0, and 0.3 where a2a-sdk handles it; the ``a2a`` extra).

**Export.** :class:`A2AExport` wraps a :class:`~reachmesh.server.app.RouterApp`: it serves an
agent card at ``/.well-known/agent-card.json`` whose skills are the tasks the Router routes (read
live from the registry on every fetch), and accepts A2A calls over JSON-RPC (``/a2a/jsonrpc``)
and HTTP+JSON (``/a2a/rest``). Each call becomes one ReachRequest for the Router's dispatcher, in
process, with all its routing and resilience: ``metadata.skill`` picks the task; without it the
message text is routed by meaning (``semantic_route``). Every other path goes to the Router.

**Import.** :func:`import_agent` reads an A2A agent's card and registers it as a managed
(lease-less) agent with ``network.protocol: a2a``: its skills become capabilities, their
descriptions and examples feed the semantic index, and the Router's health checks probe the
card. Forwarding to it is the core's (``transport/a2a.py``); only the import needs this extra.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from reachmesh import jsoncodec
from reachmesh.exceptions import ConfigError, RegistryError, RequestError
from reachmesh.integrations import missing_extra
from reachmesh.protocol import MAX_CAPABILITIES, MAX_EXAMPLE_CHARS, MAX_EXAMPLES, AgentProfile
from reachmesh.server.app import RouterApp
from reachmesh.server.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    error_body,
    header_map,
    read_body,
    send_json,
)
from reachmesh.server.auth import Action, principal_of
from reachmesh.server.catalog import catalog
from reachmesh.transport.a2a import result_of, whole_numbers
from reachmesh.version import __version__

try:
    from a2a.auth.user import User
    from a2a.client import A2ACardResolver
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.context import ServerCallContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandlerV2
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
    from a2a.server.tasks import InMemoryTaskStore
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        Task,
    )
    from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
    from google.protobuf.json_format import MessageToDict, ParseDict
    from starlette.applications import Starlette
    from starlette.authentication import SimpleUser
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("a2a", exc) from exc

JSONRPC_PATH = "/a2a/jsonrpc"
REST_PATH = "/a2a/rest"
# Finished tasks an exporting Router keeps for GetTask; older ones are dropped first.
TASKS_KEPT = 1000
_MODES = ["application/json", "text/plain"]
# The card's skill for messages routed by meaning; naming it is the same as naming none.
BY_MEANING = "agent-reach:by-meaning"


# ----------------------------------------------------------------------------------- export


def router_card(app: RouterApp, public_url: str, *, name: str = "Agent-Reach Router") -> AgentCard:
    """The Router's agent card now: one skill per routable task, and its two interfaces."""
    base = public_url.rstrip("/")
    skills = [
        AgentSkill(
            id=row["task"],
            name=row["task"],
            description=row["description"] or f"routed to {', '.join(row['agents'])}",
            tags=["agent-reach"],
            examples=row["examples"],
            input_modes=_MODES,
            output_modes=_MODES,
        )
        for row in catalog(app.parts.registry)
    ]
    # Always last, so the card is never without skills (the spec requires one): plain text.
    skills.append(
        AgentSkill(
            id=BY_MEANING,
            name="route by meaning",
            description="Send plain text without metadata.skill: the Router picks the task it means.",
            tags=["agent-reach"],
            input_modes=["text/plain"],
            output_modes=_MODES,
        )
    )
    return AgentCard(
        name=name,
        description=(
            "Routes each message to an agent registered with this Agent-Reach Router: "
            "metadata.skill names the task; plain text is routed by meaning."
        ),
        version=__version__,
        supported_interfaces=[
            AgentInterface(url=base + JSONRPC_PATH, protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=base + REST_PATH, protocol_binding="HTTP+JSON", protocol_version="1.0"),
        ],
        capabilities=AgentCapabilities(streaming=False, push_notifications=False),
        default_input_modes=_MODES,
        default_output_modes=_MODES,
        skills=skills,
    )


def envelope_for(message: dict[str, Any], request_metadata: dict[str, Any]) -> dict[str, Any]:
    """The ReachRequest for one A2A message (its JSON form, as on the wire).

    A DataPart's data is the payload (the first one, when there are several); a text-only
    message is ``{"text": ...}``. ``metadata.skill`` (on the message or the request) is the
    task; without it the text is the task, routed by meaning. ``contextId`` is the
    conversation; ``metadata.timeoutMs`` the budget.
    """
    found = message.get("metadata")
    metadata = {**request_metadata, **(found if isinstance(found, dict) else {})}
    parts = [p for p in message.get("parts") or [] if isinstance(p, dict)]
    text = "\n".join(p["text"] for p in parts if isinstance(p.get("text"), str))
    data = [whole_numbers(p["data"]) for p in parts if "data" in p]
    payload = data[0] if data and isinstance(data[0], dict) else {"text": text}
    skill = metadata.get("skill")
    envelope: dict[str, Any] = {
        "payload": payload,
        "sourceAgent": str(metadata.get("sourceAgent") or "a2a")[:256],
    }
    if isinstance(skill, str) and skill and skill != BY_MEANING:
        envelope["targetTask"] = skill
    else:
        envelope["targetTask"] = text[:1024] or "-"
        envelope["preferences"] = {"strategy": "semantic_route"}
    timeout = metadata.get("timeoutMs")
    if (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and math.isfinite(timeout)
        and timeout > 0
    ):
        # Capped to a 32-bit count: the Router caps it further (limits.max_timeout_ms); a bigger
        # number would not even encode.
        envelope.setdefault("preferences", {})["timeoutMs"] = int(min(timeout, 2**31 - 1))
    if isinstance(message.get("contextId"), str) and message["contextId"]:
        envelope["conversationId"] = message["contextId"]
    return envelope


def result_parts(result: Any) -> list[dict[str, Any]]:
    """A Reach ``result`` as A2A parts: text as a TextPart, anything else as one DataPart."""
    return [{"text": result}] if isinstance(result, str) else [{"data": result}]


def task_for(reply: dict[str, Any], message: dict[str, Any], task_id: str, context_id: str) -> dict[str, Any]:
    """The A2A task (JSON) a ReachResponse ends in: completed with the result as an artifact,
    or failed with the status and the whole ReachResponse error in its status message."""
    task: dict[str, Any] = {"id": task_id, "contextId": context_id, "history": [message]}
    if reply.get("status") == "SUCCESS":
        task["status"] = {"state": "TASK_STATE_COMPLETED"}
        meta = {"handlerAgentId": reply.get("handlerAgentId"), "traceId": reply.get("traceId")}
        task["artifacts"] = [
            {
                "artifactId": uuid.uuid4().hex,
                "name": "result",
                "parts": result_parts(reply.get("result")),
                "metadata": meta,
            }
        ]
        return task
    error = reply.get("error") or {}
    note = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_AGENT",
        "contextId": context_id,
        "taskId": task_id,
        "parts": [
            {"text": f"{reply.get('status')}: {error.get('message', '')}"},
            # The whole ReachResponse error, so an A2A caller can branch on its code.
            {"data": {"status": reply.get("status"), "traceId": reply.get("traceId"), "error": error}},
        ],
    }
    task["status"] = {"state": "TASK_STATE_FAILED", "message": note}
    return task


async def run_message(
    app: RouterApp, message: dict[str, Any], metadata: dict[str, Any], task_id: str, context_id: str
) -> dict[str, Any]:
    """One A2A message through the Router's dispatcher, in process: the task it ends in."""
    message = {**message, "contextId": context_id}
    _, body = await app.parts.dispatcher.handle(orjson.dumps(envelope_for(message, metadata)))
    return task_for(orjson.loads(body), message, task_id, context_id)


class ReachExecutor(AgentExecutor):
    """Runs each A2A message as one ReachRequest through the Router's own dispatcher (the path
    of every A2A call the fast path below does not take: HTTP+JSON, streaming, A2A 0.3)."""

    def __init__(self, app: RouterApp) -> None:
        self.app = app

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        if context.message is None:
            return
        task = await run_message(
            self.app,
            MessageToDict(context.message),
            context.metadata,
            context.task_id or uuid.uuid4().hex,
            context.context_id or uuid.uuid4().hex,
        )
        await event_queue.enqueue_event(ParseDict(task, Task()))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """A Reach request runs to its deadline and cannot be cancelled half-way."""
        raise ConfigError("Agent-Reach requests cannot be cancelled")


class _Owner(User):
    """A task's owner as a2a-sdk sees it: the caller's token fingerprint (``auth-off`` with auth
    off). a2a-sdk's store keys tasks by owner, so one caller cannot read another's tasks."""

    def __init__(self, key: str) -> None:
        self._key = key

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._key


def owner_context(key: str) -> ServerCallContext:
    return ServerCallContext(user=_Owner(key))


class BoundedTaskStore(InMemoryTaskStore):
    """An in-memory task store, kept per owner, that forgets the oldest tasks past ``limit``: a
    Router runs for months, and every A2A call leaves a task behind."""

    def __init__(self, limit: int = TASKS_KEPT) -> None:
        super().__init__()
        self._order: deque[tuple[str, str]] = deque()
        self._seen: set[tuple[str, str]] = set()
        self._limit = limit

    async def save(self, task: Task, context: ServerCallContext) -> None:
        key = (context.user.user_name, task.id)
        if key not in self._seen:
            self._seen.add(key)
            self._order.append(key)
        await super().save(task, context)
        while len(self._order) > self._limit:
            owner, task_id = self._order.popleft()
            self._seen.discard((owner, task_id))
            await self.delete(task_id, owner_context(owner))


class A2AExport:
    """The Router with an A2A face: the card and the A2A endpoints here, the rest to the Router.

    The Router's guard admits A2A calls as ``reach`` calls (caller, agent or admin tokens) and
    the card as public, like ``/healthz``.
    """

    def __init__(self, app: RouterApp, public_url: str, *, name: str = "Agent-Reach Router") -> None:
        self.router = app
        self.public_url = public_url.rstrip("/")
        self.name = name
        card = router_card(app, public_url, name=name)
        self.tasks = BoundedTaskStore()
        handler = DefaultRequestHandlerV2(
            agent_executor=ReachExecutor(app), task_store=self.tasks, agent_card=card
        )
        routes = [
            *create_agent_card_routes(card, card_modifier=self._live_card),
            *create_jsonrpc_routes(handler, JSONRPC_PATH, enable_v0_3_compat=True),
            *create_rest_routes(handler, path_prefix=REST_PATH, enable_v0_3_compat=True),
        ]
        self.a2a = Starlette(routes=routes)

    async def _live_card(self, card: AgentCard) -> AgentCard:
        return router_card(self.router, self.public_url, name=self.name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.router(scope, receive, send)
            return
        path = scope["path"]
        is_card = path == AGENT_CARD_WELL_KNOWN_PATH
        if not (is_card or path.startswith(("/a2a/", "/a2a"))):
            await self.router(scope, receive, send)
            return
        denial = self.router.guard.check(Action.PUBLIC if is_card else Action.REACH, scope)
        if denial is not None:
            body = error_body(denial.status.value, denial.message)
            await send_json(send, denial.http_status, body, list(denial.headers) or None)
            return
        # a2a-sdk scopes its tasks to ``scope["user"]``: the caller's token, as GET /reach/{id} is.
        scope = {**scope, "user": SimpleUser(principal_of(scope).key)}
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.a2a(scope, receive, send)
        else:
            await self._with_body(scope, receive, send)

    async def _with_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body here, under the Router's body limits and JSON depth, before a2a-sdk
        parses it; then the fast path or a2a-sdk with the body replayed."""
        server = self.router.config.server
        headers = header_map(scope)
        try:
            body = await read_body(receive, headers, server.body_limit_bytes, server.body_timeout_seconds)
            _check_depth(body, server.max_json_depth)
        except RequestError as exc:
            await send_json(send, exc.http_status, error_body(exc.code, exc.message))
            return
        except ClientGone:
            return
        if scope["path"] == JSONRPC_PATH and scope["method"] == "POST":
            await self._jsonrpc(scope, body, headers, send)
        else:
            await self.a2a(scope, _replay(body), send)

    async def _jsonrpc(self, scope: Scope, body: bytes, headers: dict[bytes, bytes], send: Send) -> None:
        """A blocking A2A 1.0 ``SendMessage`` is answered here, straight from the dispatcher:
        a2a-sdk's request handler (task events, queues, protobuf at every step) costs about
        2 ms per call. Anything else (another method, streaming, push configuration, a task
        being continued, A2A 0.3, a malformed request) goes to a2a-sdk with the body replayed."""
        request = _fast_send_message(body, headers)
        if request is None:
            await self.a2a(scope, _replay(body), send)
            return
        message, metadata = request["params"]["message"], request["params"].get("metadata") or {}
        task = await run_message(
            self.router, message, metadata, uuid.uuid4().hex, message.get("contextId") or uuid.uuid4().hex
        )
        # Kept like a2a-sdk keeps its tasks (per owner), so the caller's GetTask finds it.
        owner = scope["user"].display_name
        await self.tasks.save(ParseDict(task, Task()), owner_context(owner))
        answer = orjson.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": {"task": task}})
        await send_json(send, 200, answer)


def _check_depth(body: bytes, limit: int) -> None:
    """Refuse (400) a body nested deeper than ``server.max_json_depth``, as ``POST /reach`` does:
    a2a-sdk's own parser would recurse until it fails."""
    if not jsoncodec.may_nest_deeper(body, limit):
        return
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc).lower() or "recursion" in str(exc).lower():
            raise RequestError(f"the body nests deeper than {limit} levels") from exc
        return  # not JSON at all: a2a-sdk answers that in its own words
    if jsoncodec.depth(value, limit) > limit:
        raise RequestError(f"the body nests deeper than {limit} levels")


def _fast_send_message(body: bytes, headers: dict[bytes, bytes]) -> dict[str, Any] | None:
    """The request, when it is a blocking 1.0 SendMessage the fast path may answer; else None."""
    version = headers.get(b"a2a-version", b"1.0").strip()
    if not version.startswith(b"1."):
        return None
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if (
        not isinstance(request, dict)
        or request.get("jsonrpc") != "2.0"
        or request.get("method") != "SendMessage"
    ):
        return None
    params = request.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("message"), dict):
        return None
    message = params["message"]
    config = params.get("configuration") or {}
    if (
        not isinstance(config, dict)
        or config.get("returnImmediately")
        or config.get("taskPushNotificationConfig")
        or message.get("taskId")
        or not isinstance(message.get("parts"), list)
        or not message["parts"]
        or not isinstance(params.get("metadata") or {}, dict)
        or params.get("tenant")
    ):
        return None
    return request


def _replay(body: bytes) -> Receive:
    """An ASGI ``receive`` that hands over a body already read, then waits for disconnect."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


# ----------------------------------------------------------------------------------- import

_NOT_ID = re.compile(r"[^a-z0-9._-]+")
_NOT_TASK = re.compile(r"[^\w.:-]+")


def agent_id_for(card: AgentCard) -> str:
    """A registry id from the card's name: lower case, other characters as ``-``."""
    slug = _NOT_ID.sub("-", card.name.lower()).strip("-._")[:128]
    return slug or "a2a-agent"


def jsonrpc_url(card: AgentCard) -> str:
    """The card's JSON-RPC interface (the binding the Router speaks to imported agents)."""
    for interface in card.supported_interfaces:
        version = interface.protocol_version or "1.0"
        if interface.protocol_binding.upper() == "JSONRPC" and version.startswith("1."):
            return str(interface.url)
    offered = ", ".join(f"{i.protocol_binding} {i.protocol_version}" for i in card.supported_interfaces)
    raise ConfigError(
        f"agent card {card.name!r} offers no A2A 1.x JSON-RPC interface (offers: {offered or 'none'})"
    )


def profile_from_card(
    card: AgentCard, card_url: str, *, agent_id: str | None = None, health_interval_s: float = 15.0
) -> AgentProfile:
    """The Reach profile of an A2A agent: skills as capabilities, the card as health check."""
    if not card.skills:
        raise ConfigError(f"agent card {card.name!r} declares no skills: nothing to route to it")
    capabilities = []
    for skill in list(card.skills)[:MAX_CAPABILITIES]:
        description = skill.description or skill.name
        if skill.tags:
            description = f"{description} (tags: {', '.join(skill.tags)})"
        capabilities.append(
            {
                "task": _NOT_TASK.sub("_", skill.id)[:128],
                "description": description[:2048],
                "examples": [e[:MAX_EXAMPLE_CHARS] for e in list(skill.examples)[:MAX_EXAMPLES]],
            }
        )
    endpoint = jsonrpc_url(card)
    card_parts = urlsplit(card_url)
    health: dict[str, Any] = {"path": card_parts.path or AGENT_CARD_WELL_KNOWN_PATH}
    health["interval_seconds"] = health_interval_s
    if card_parts.port and card_parts.port != urlsplit(endpoint).port:
        health["port"] = card_parts.port
    try:
        return AgentProfile.model_validate(
            {
                "id": agent_id or agent_id_for(card),
                "display_name": card.name[:256],
                "network": {"protocol": "a2a", "endpoint": endpoint},
                "capabilities": capabilities,
                "health_check": health,
            }
        )
    except ValueError as exc:
        raise ConfigError(f"agent card {card.name!r} does not make a valid profile: {exc}") from exc


def card_location(url: str) -> tuple[str, str]:
    """(base URL, card path) for a card URL or an agent's base URL."""
    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}"
    path = parts.path if parts.path.endswith(".json") else AGENT_CARD_WELL_KNOWN_PATH
    return base, path


async def fetch_card(url: str, *, http: httpx.AsyncClient) -> tuple[AgentCard, str]:
    """The agent card at ``url`` (a card URL, or the agent's base URL), and where it was."""
    base, path = card_location(url)
    try:
        card = await A2ACardResolver(http, base, agent_card_path=path).get_agent_card()
    except Exception as exc:  # a2a-sdk raises its own client errors; mapped at this edge
        raise ConfigError(f"cannot read an A2A agent card at {base}{path}: {exc}") from exc
    return card, base + path


async def import_agent(
    url: str,
    router_url: str,
    *,
    agent_id: str | None = None,
    token: str | None = None,
    health_interval_s: float = 15.0,
    http: httpx.AsyncClient | None = None,
) -> dict[str, Any]:
    """Read the A2A agent card at ``url`` and register the agent with the Router (managed).

    Returns the registration (``agentId``, ``leaseId``, ...) with the ``profile`` registered;
    the lease id is what removes it again (``DELETE /agents/{id}``). Needs an admin token when
    the Router has auth on.
    """
    own = http is None
    client = http or httpx.AsyncClient(timeout=10)
    try:
        card, card_url = await fetch_card(url, http=client)
        profile = profile_from_card(card, card_url, agent_id=agent_id, health_interval_s=health_interval_s)
        body = {**profile.model_dump(mode="json"), "managed": True}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            resp = await client.post(f"{router_url.rstrip('/')}/agents", json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ConfigError(f"cannot reach the Router at {router_url}: {exc!r}") from exc
        answer = resp.json() if resp.content else {}
        if resp.status_code not in (200, 201):
            error = answer.get("error", {}) if isinstance(answer, dict) else {}
            failure = RegistryError(
                f"the Router refused the import: {error.get('message', resp.status_code)}"
            )
            failure.code = str(error.get("code") or "REGISTRATION_FAILED")
            raise failure
        return {**answer, "profile": body}
    finally:
        if own:
            await client.aclose()


__all__ = [
    "JSONRPC_PATH",
    "REST_PATH",
    "A2AExport",
    "ReachExecutor",
    "fetch_card",
    "import_agent",
    "profile_from_card",
    "result_of",
    "router_card",
]
