"""The Router's A2A face (A2A 1.0, and 0.3 where a2a-sdk handles it; the ``a2a`` extra).

:class:`A2AExport` wraps a :class:`~reachmesh.server.app.RouterApp`: it serves an
agent card at ``/.well-known/agent-card.json`` whose skills are the tasks the Router routes (read
live from the registry on every fetch), and accepts A2A calls over JSON-RPC (``/a2a/jsonrpc``)
and HTTP+JSON (``/a2a/rest``). Each call becomes one ReachRequest for the Router's dispatcher, in
process, with all its routing and resilience: ``metadata.skill`` picks the task; without it the
message text is routed by meaning (``semantic_route``). Every other path goes to the Router.

The other way, an A2A agent joining a Router by its card, is
:mod:`reachmesh.integrations.a2a_import` (:func:`import_agent`, re-exported here).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Coroutine, Iterable
from contextvars import ContextVar
from typing import Any
from urllib.parse import parse_qs

import orjson

from reachmesh import jsoncodec
from reachmesh.clock import Clock
from reachmesh.exceptions import ConfigError, RequestError
from reachmesh.integrations import described, missing_extra
from reachmesh.integrations.a2a_import import fetch_card, import_agent, profile_from_card
from reachmesh.lifecycle import unless_first
from reachmesh.server.app import RouterApp
from reachmesh.server.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    check_json_content_type,
    count_hops,
    error_body,
    header_map,
    read_body,
    send_json,
)
from reachmesh.server.auth import Action, principal_of
from reachmesh.server.catalog import catalog
from reachmesh.server.h1 import CALL_TASK
from reachmesh.tally import Tally
from reachmesh.transport.a2a import result_of, whole_numbers
from reachmesh.version import __version__

try:
    from a2a.auth.user import User
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
        Artifact,
        Role,
        Task,
        TaskArtifactUpdateEvent,
        TaskState,
        TaskStatus,
        TaskStatusUpdateEvent,
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
# What ProtoJSON accepts for the enums the bridge checks itself (a name or a number).
_STATE_NAMES = frozenset(TaskState.keys())
_STATE_NUMBERS = frozenset(TaskState.values())
_ROLE_NAMES = frozenset(Role.keys()) - {"ROLE_UNSPECIFIED"}
_ROLE_NUMBERS = frozenset(Role.values()) - {Role.ROLE_UNSPECIFIED}
_STREAM_METHODS = frozenset({"SendStreamingMessage", "message/stream"})
# Set by the export on a REST ``message:stream`` call (a caller's own is dropped first): the
# only sign of a streaming call a2a-sdk passes on to the executor for that binding.
_STREAM_MARK = b"x-agent-reach-a2a-stream"
# Set when the caller of the A2A request being served goes away. a2a-sdk runs the executor in a
# task of its own, created while it serves the request, so that task sees the request's value:
# a streamed call then stops (closing the agent's connection) instead of running to its end.
_CALLER_GONE: ContextVar[asyncio.Event | None] = ContextVar("a2a_caller_gone", default=None)
# Whom the per-client limits count the A2A request being served against (RouterApp.client_key),
# carried to the dispatcher the same way: a full agent's queue takes turns between clients by it.
_CLIENT: ContextVar[str | None] = ContextVar("a2a_client", default=None)


# ----------------------------------------------------------------------------------- export


def router_card(app: RouterApp, public_url: str, *, name: str = "Agent-Reach Router") -> AgentCard:
    """The Router's agent card now: one skill per routable task, and its two interfaces."""
    base = public_url.rstrip("/")
    skills = [
        AgentSkill(
            id=row["task"],
            name=row["task"],
            description=described(row, f"routed to {', '.join(row['agents'])}"),
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
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
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
            {"text": failure_text(reply.get("status"), error)},
            # The whole ReachResponse error, so an A2A caller can branch on its code.
            {"data": {"status": reply.get("status"), "traceId": reply.get("traceId"), "error": error}},
        ],
    }
    state = "TASK_STATE_REJECTED" if all_declined(error) else "TASK_STATE_FAILED"
    task["status"] = {"state": state, "message": note}
    return task


def failure_text(status: Any, error: dict[str, Any]) -> str:
    """The status message's text: the status and the error's message, and for a busy answer
    when to try again (a reader of the text, a model, does not see the DataPart's fields)."""
    text = f"{status}: {error.get('message', '')}"
    if error.get("retryAfterSeconds") is not None:
        text += f" (busy, not broken: try again in {error['retryAfterSeconds']} s)"
    return text


def all_declined(error: dict[str, Any]) -> bool:
    """Whether every candidate declined the request: A2A's "rejected", not a failure."""
    candidates = error.get("candidates") or []
    return bool(candidates) and all(isinstance(c, dict) and c.get("reason") == "declined" for c in candidates)


async def run_message(
    app: RouterApp,
    message: dict[str, Any],
    metadata: dict[str, Any],
    task_id: str,
    context_id: str,
    stamps: StatusStamps,
    caller: str = "-",
) -> tuple[dict[str, Any], int]:
    """One A2A message through the Router's dispatcher, in process: the task it ends in, its
    status stamped when it ended (ListTasks orders and filters by that time), and that time in
    ms since the epoch. ``caller`` is the principal's key, as ``/reach`` passes it: learning
    keys what it learns by caller, so A2A callers are not lumped together."""
    message = {**message, "contextId": context_id}
    envelope = orjson.dumps(envelope_for(message, metadata))
    body = await _until_caller_gone(
        app, app.parts.dispatcher.handle(envelope, caller=caller, client=_CLIENT.get())
    )
    task = task_for(orjson.loads(body), message, task_id, context_id)
    ms = stamps.next()
    task["status"]["timestamp"] = iso_ms(ms)
    return task, ms


class ArtifactSink:
    """A streamed answer's chunks as A2A artifact updates, each as it comes: one artifact, its
    parts appended chunk by chunk (``append`` from the second on). The dispatcher's relay waits
    on :meth:`send_chunks`, so a2a-sdk's queue paces the read from the agent."""

    def __init__(self, queue: EventQueue, task_id: str, context_id: str) -> None:
        self.opened = False
        self.chunks = 0
        self._queue = queue
        self._ids = {"task_id": task_id, "context_id": context_id}
        self._artifact_id = uuid.uuid4().hex

    async def chunk(self, data: bytes) -> None:
        self.opened = True
        artifact: dict[str, Any] = {"artifactId": self._artifact_id, "name": "stream"}
        artifact["parts"] = result_parts(jsoncodec.loads(data))
        update = TaskArtifactUpdateEvent(
            **self._ids, artifact=ParseDict(artifact, Artifact()), append=self.chunks > 0, last_chunk=False
        )
        self.chunks += 1
        await self._queue.enqueue_event(update)

    async def send_chunks(self, data: list[bytes]) -> None:
        # One artifact update per chunk, even for chunks the relay read together.
        for value in data:
            await self.chunk(value)


async def stream_message(
    app: RouterApp,
    message: dict[str, Any],
    metadata: dict[str, Any],
    ids: tuple[str, str],
    queue: EventQueue,
    stamps: StatusStamps,
    caller: str = "-",
) -> None:
    """One A2A message through the dispatcher as a streamed request (protocol §14): the task
    (working), an artifact update per chunk as the agent sends it, then the final status.

    A result the agent's ``done`` carried (or a whole answer with no chunk before it) is one
    more artifact, ``result``, as in a blocking call; a failure is the failed (or rejected)
    status with the ReachResponse error in its message, as :func:`task_for` builds it.
    """
    task_id, context_id = ids
    message = {**message, "contextId": context_id}
    working: dict[str, Any] = {"id": task_id, "contextId": context_id, "history": [message]}
    working["status"] = {"state": "TASK_STATE_WORKING"}
    await queue.enqueue_event(task_proto(working, stamps.next()))
    sink = ArtifactSink(queue, task_id, context_id)
    envelope = orjson.dumps(envelope_for(message, metadata))
    dispatch = app.parts.dispatcher.handle(envelope, caller=caller, client=_CLIENT.get(), sink=sink)
    body = await _unless_gone(dispatch)
    if body is None:
        return  # the caller went away: nobody is left to tell, and the agent's call is closed
    reply = jsoncodec.loads(body)
    ended = task_for(reply, message, task_id, context_id)
    if ended.get("artifacts") and (sink.chunks == 0 or reply.get("result") is not None):
        update = TaskArtifactUpdateEvent(
            task_id=task_id, context_id=context_id, artifact=ParseDict(ended["artifacts"][0], Artifact())
        )
        update.last_chunk = True
        await queue.enqueue_event(update)
    status: TaskStatus = ParseDict(ended["status"], TaskStatus())
    status.timestamp.FromMilliseconds(stamps.next())
    final = TaskStatusUpdateEvent(task_id=task_id, context_id=context_id, status=status)
    ends = {"handlerAgentId": reply.get("handlerAgentId"), "traceId": reply.get("traceId")}
    final.metadata.update({**ends, "chunks": sink.chunks})
    await queue.enqueue_event(final)


async def _unless_gone(dispatch: Coroutine[Any, Any, tuple[int, bytes]]) -> bytes | None:
    """The body ``dispatch`` answers, or None when the A2A caller went away first (the
    dispatch is then cancelled, which closes the Router's connection to the agent)."""
    work = asyncio.ensure_future(dispatch)
    gone = _CALLER_GONE.get()
    await unless_first(work, asyncio.ensure_future(gone.wait()) if gone is not None else None)
    if work.cancelled():
        return None
    return work.result()[1]


async def _until_caller_gone(app: RouterApp, dispatch: Coroutine[Any, Any, tuple[int, bytes]]) -> bytes:
    """The body ``dispatch`` answers. When the A2A caller goes away first (``_CALLER_GONE``, in
    a2a-sdk's executor task), the call stops as a ``/reach`` call does: cut by the dispatcher,
    which closes the agent's connection and books it ``CALLER_GONE`` (the body says so, to
    nobody). Not in a2a-sdk's task (the fast path), the server's protocol cuts the request's
    own task (:meth:`A2AExport.callers_gone`)."""
    gone = _CALLER_GONE.get()
    if gone is None:
        return (await dispatch)[1]
    work = asyncio.ensure_future(dispatch)
    watch = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            app.parts.dispatcher.callers_gone((work,))
        return (await work)[1]
    finally:
        watch.cancel()
        if not work.done():  # this task cancelled (a2a-sdk's): the call goes with it
            work.cancel()


def task_proto(task: dict[str, Any], ms: int) -> Task:
    """``task`` as protobuf, its status time set from ``ms``: ParseDict would read the ISO
    text again, which costs about 0.1 ms, a third of the whole conversion."""
    status = task["status"]
    stamp = status.pop("timestamp", None)
    try:
        proto: Task = ParseDict(task, Task())
    finally:
        if stamp is not None:
            status["timestamp"] = stamp
    proto.status.timestamp.FromMilliseconds(ms)
    return proto


def iso_ms(ms: int) -> str:
    """A time in ms since the epoch as A2A writes it (§5.6.1): ``YYYY-MM-DDTHH:mm:ss.sssZ``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


class StatusStamps:
    """Task status times in ms since the epoch, strictly increasing, so "newest status first"
    (A2A §3.1.4) holds for tasks that end in the same millisecond."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last_ms = 0

    def next(self) -> int:
        self._last_ms = max(int(self._clock.time() * 1000), self._last_ms + 1)
        return self._last_ms


class ReachExecutor(AgentExecutor):
    """Runs each A2A message as one ReachRequest through the Router's own dispatcher (the path
    of every A2A call the fast path below does not take: HTTP+JSON, streaming, A2A 0.3)."""

    def __init__(self, app: RouterApp, stamps: StatusStamps | None = None) -> None:
        self.app = app
        self.stamps = stamps or StatusStamps(app.parts.clock)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        if context.message is None:
            return
        if _streamed(context):
            await stream_message(
                self.app,
                MessageToDict(context.message),
                context.metadata,
                (context.task_id or uuid.uuid4().hex, context.context_id or uuid.uuid4().hex),
                event_queue,
                self.stamps,
                _caller_of(context),
            )
            return
        task, ms = await run_message(
            self.app,
            MessageToDict(context.message),
            context.metadata,
            context.task_id or uuid.uuid4().hex,
            context.context_id or uuid.uuid4().hex,
            self.stamps,
            _caller_of(context),
        )
        await event_queue.enqueue_event(task_proto(task, ms))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """A Reach request runs to its deadline and cannot be cancelled half-way."""
        raise ConfigError("Agent-Reach requests cannot be cancelled")


def _streamed(context: RequestContext) -> bool:
    """Whether the call is a streaming one (``SendStreamingMessage``, or REST ``message:stream``),
    as :class:`A2AExport` marked it: a2a-sdk runs both kinds through the same ``execute``."""
    call = context.call_context
    if call.state.get("method") in _STREAM_METHODS:
        return True
    headers = call.state.get("headers")
    return isinstance(headers, dict) and headers.get(_STREAM_MARK.decode()) == "1"


def _caller_of(context: RequestContext) -> str:
    """The principal's key a2a-sdk carried from ``scope["user"]`` (set by :class:`A2AExport`)."""
    call = context.call_context
    user = call.user if call is not None else None
    return str(user.user_name) if user is not None and user.is_authenticated else "-"


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
    """An in-memory task store, kept per owner, that forgets tasks past ``limit`` or past
    ``max_bytes``: a Router runs for months, every A2A call leaves a task behind, and a task
    holds what an agent answered (30 answers of 4 MB once grew the Router by 165 MiB).

    What goes is the oldest task of the owner holding the most (tasks past ``limit``, bytes past
    ``max_bytes``), as the async result store does: oldest of all once let one caller's thousand
    calls drop every other caller's tasks."""

    def __init__(
        self,
        limit: int = TASKS_KEPT,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_task_bytes: int = 1024 * 1024,
    ) -> None:
        super().__init__()
        # Each owner's tasks and their sizes, oldest first; and who holds how many, and how much.
        self._owned: dict[str, dict[str, int]] = {}
        self._owner_bytes: dict[str, int] = {}
        self._counts = Tally()
        self._held = 0
        self._limit = limit
        self.max_bytes = max_bytes
        self.max_task_bytes = max_task_bytes
        self.bytes_held = 0
        self.slimmed = 0

    def _slim(self, task: Task, size: int) -> Task:
        """``task`` without its artifacts and history, saying why, for one over max_task_bytes."""
        slim = Task()
        slim.CopyFrom(task)
        del slim.artifacts[:]
        del slim.history[:]
        slim.metadata.update(
            {
                "agentReachOmitted": f"artifacts and history left out: the task was {size} bytes, "
                f"over the Router's a2a.max_task_bytes ({self.max_task_bytes}); the call's "
                "answer carried them"
            }
        )
        self.slimmed += 1
        return slim

    async def save(self, task: Task, context: ServerCallContext) -> None:
        owner = context.user.user_name
        size = task.ByteSize()
        if size > self.max_task_bytes:
            task = self._slim(task, size)
            size = task.ByteSize()
        owned = self._owned.setdefault(owner, {})
        before = owned.pop(task.id, None)
        if before is None:
            self._counts.moved(owner, len(owned), len(owned) + 1)
            self._held += 1
        owned[task.id] = size  # saved again: newest again, as before
        grown = size - (before or 0)
        self.bytes_held += grown
        self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + grown
        await super().save(task, context)
        while self._held > 1 and (self._held > self._limit or self.bytes_held > self.max_bytes):
            if self._held > self._limit:
                most = self._counts.first_of_most()
            else:  # rare, and at most a2a.max_tasks owners to look at
                most = max(self._owner_bytes, key=self._owner_bytes.__getitem__)
            await self._drop_oldest(most)

    async def _drop_oldest(self, owner: str) -> None:
        owned = self._owned[owner]
        task_id = next(iter(owned))
        gone = owned.pop(task_id)
        self._counts.moved(owner, len(owned) + 1, len(owned))
        self._held -= 1
        self.bytes_held -= gone
        self._owner_bytes[owner] -= gone
        if not owned:
            del self._owned[owner], self._owner_bytes[owner]
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
        policy = app.config.a2a
        self.tasks = tasks = BoundedTaskStore(
            policy.max_tasks, max_bytes=policy.max_store_bytes, max_task_bytes=policy.max_task_bytes
        )
        app.parts.metrics.gauge(
            "reach_a2a_task_bytes",
            "Bytes of A2A tasks held for GetTask by the A2A export (a2a.max_store_bytes)",
            lambda: tasks.bytes_held,
        )
        self.stamps = StatusStamps(app.parts.clock)
        handler = DefaultRequestHandlerV2(
            agent_executor=ReachExecutor(app, self.stamps), task_store=self.tasks, agent_card=card
        )
        routes = [
            *create_agent_card_routes(card, card_modifier=self._live_card),
            *create_jsonrpc_routes(handler, JSONRPC_PATH, enable_v0_3_compat=True),
            *create_rest_routes(handler, path_prefix=REST_PATH, enable_v0_3_compat=True),
        ]
        self.a2a = Starlette(routes=routes)
        # A path a2a-sdk does not serve is a 404, never a redirect: Starlette's slash redirect
        # builds its Location from the client's Host header.
        self.a2a.router.redirect_slashes = False
        # The caller-gone events of the A2A requests a2a-sdk serves, by the request's task.
        self._gone: dict[asyncio.Task[Any], asyncio.Event] = {}

    def callers_gone(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        """A connection closed with these tasks still serving it (the server's protocol says
        so, as for ``/reach``): a call the dispatcher runs in one of them (``/reach``, the A2A
        fast path) is cut there; one a2a-sdk runs in a task of its own is told through its
        ``_CALLER_GONE`` event (see :func:`_until_caller_gone`)."""
        tasks = tuple(tasks)
        for task in tasks:
            gone = self._gone.get(task)
            if gone is not None:
                gone.set()
        self.router.callers_gone(tasks)

    async def _live_card(self, card: AgentCard) -> AgentCard:
        return router_card(self.router, self.public_url, name=self.name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.router(scope, receive, send)
            return
        path = scope["path"]
        is_card = path == AGENT_CARD_WELL_KNOWN_PATH
        if not (is_card or path.startswith("/a2a/")):
            await self.router(scope, receive, send)
            return
        denial = self.router.admit(Action.PUBLIC if is_card else Action.REACH, scope)
        if denial is not None:
            body = error_body(denial.status.value, denial.message)
            await send_json(send, denial.http_status, body, list(denial.headers) or None)
            return
        # Named on the server's own scope (the copy below is a2a-sdk's): a caller that leaves
        # mid-call stops it (callers_gone), as on /reach.
        served = scope
        # a2a-sdk scopes its tasks to ``scope["user"]``: the caller's token, as GET /reach/{id} is.
        scope = {**scope, "user": SimpleUser(principal_of(scope).key), "headers": _marked(scope)}
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            refusal = _list_tasks_query_error(scope)
            if refusal is not None:
                await send_json(send, 400, refusal)
                return
            await self.a2a(scope, receive, send)
            return
        # Through the load shedder like POST /reach, and counted against the same client: 200
        # concurrent SendMessage calls on one token all ran while /reach shed 192 of them.
        shedder, peer = self.router.parts.shedder, self.router.client_key(scope)
        shed = shedder.admit(peer)
        if shed is not None:
            await self._shed(send, shed)
            return
        served[CALL_TASK] = asyncio.current_task()
        client = _CLIENT.set(peer)
        try:
            await self._with_body(scope, receive, send)
        finally:
            _CLIENT.reset(client)
            shedder.release(peer)

    async def _shed(self, send: Send, reason: str) -> None:
        """429 OVERLOADED with Retry-After, counted and traced like a shed ``/reach`` call."""
        parts = self.router.parts
        parts.dispatcher.shed(reason)
        retry_after = parts.config.limits.retry_after_seconds
        body = error_body(
            "OVERLOADED", f"the Router is shedding load: {reason}", retryAfterSeconds=retry_after
        )
        await send_json(send, 429, body, [(b"retry-after", str(retry_after).encode())])

    async def _with_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body here, under the Router's body limits and JSON depth, before a2a-sdk
        parses it; then the fast path or a2a-sdk with the body replayed."""
        server = self.router.config.server
        headers = header_map(scope)
        try:
            check_json_content_type(headers)
            count_hops(headers)
            body = await read_body(receive, headers, server.body_limit_bytes, server.body_timeout_seconds)
            _check_depth(body, server.max_json_depth)
        except RequestError as exc:
            await send_json(send, exc.http_status, error_body(exc.code, exc.message))
            return
        except ClientGone:
            return
        if scope["path"] == JSONRPC_PATH and scope["method"] == "POST":
            await self._jsonrpc(scope, body, headers, receive, send)
        else:
            await self._sdk(scope, body, receive, send)

    async def _sdk(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        """a2a-sdk serves the request, its body replayed; a streamed call stops when its caller
        goes away (see ``_CALLER_GONE``)."""
        gone = asyncio.Event()
        token = _CALLER_GONE.set(gone)
        task = asyncio.current_task()
        if task is not None:
            self._gone[task] = gone
        try:
            await self.a2a(scope, _replay(body, receive, gone), send)
        finally:
            _CALLER_GONE.reset(token)
            if task is not None:
                del self._gone[task]

    async def _jsonrpc(
        self, scope: Scope, body: bytes, headers: dict[bytes, bytes], receive: Receive, send: Send
    ) -> None:
        """A blocking A2A 1.0 ``SendMessage`` is answered here, straight from the dispatcher:
        a2a-sdk's request handler (task events, queues, protobuf at every step) costs about
        2 ms per call. Anything else (another method, streaming, push configuration, a task
        being continued, A2A 0.3, a malformed request) goes to a2a-sdk with the body replayed."""
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None  # a2a-sdk answers a parse error in its own words
        one_oh = headers.get(b"a2a-version", b"").strip().startswith(b"1.")
        refusal = _invalid_params(parsed) if one_oh and isinstance(parsed, dict) else None
        if refusal is not None:
            await send_json(send, 200, refusal)
            return
        request = _fast_send_message(parsed, headers)
        if request is None:
            await self._sdk(scope, body, receive, send)
            return
        message, metadata = request["params"]["message"], request["params"].get("metadata") or {}
        owner = scope["user"].display_name
        task, ms = await run_message(
            self.router,
            message,
            metadata,
            uuid.uuid4().hex,
            message.get("contextId") or uuid.uuid4().hex,
            self.stamps,
            owner,
        )
        # Kept like a2a-sdk keeps its tasks (per owner), so the caller's GetTask finds it.
        await self.tasks.save(task_proto(task, ms), owner_context(owner))
        answer = orjson.dumps({"jsonrpc": "2.0", "id": request.get("id"), "result": {"task": task}})
        await send_json(send, 200, answer)


def _marked(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The request's headers as a2a-sdk should see them: versioned (:func:`_versioned`), and
    marked when the call is a REST streaming one (see ``_STREAM_MARK``)."""
    headers = [(k, v) for k, v in _versioned(scope) if k != _STREAM_MARK]
    if scope["path"].startswith(REST_PATH) and scope["path"].endswith("/message:stream"):
        headers.append((_STREAM_MARK, b"1"))
    return headers


def _versioned(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The request's headers, with ``A2A-Version`` taken from the query when only it names one.

    A2A §3.6.1: "Clients MAY provide the A2A-Version as a request parameter instead of a
    header". a2a-sdk reads only the header, so the parameter becomes one here, and every
    method then follows one rule: the version asked for, and 0.3 when none is (§3.6.2).
    """
    headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
    if any(name == b"a2a-version" for name, _ in headers):
        return headers
    asked = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("A2A-Version")
    if asked and asked[-1].strip():
        headers.append((b"a2a-version", asked[-1].strip().encode("latin-1")))
    return headers


def _valid_state(value: object) -> bool:
    """Whether ``value`` names a TaskState as ProtoJSON writes one (its name, or its number)."""
    if isinstance(value, str):
        return value in _STATE_NAMES
    return isinstance(value, int) and not isinstance(value, bool) and value in _STATE_NUMBERS


def _list_tasks_query_error(scope: Scope) -> bytes | None:
    """The 400 answer to a 1.0 REST ``GET .../tasks`` whose ``status`` is no TaskState, else None.

    A2A §3.3.2: "Servers MUST validate all input parameters before processing"; a2a-sdk drops
    an unknown enum value and lists every task instead. The body is a google.rpc.Status with a
    BadRequest detail, as §11.6 asks of HTTP errors.
    """
    path = scope["path"]
    if not (path.startswith(REST_PATH + "/") and path.endswith("/tasks")):
        return None
    if not header_map(scope).get(b"a2a-version", b"").strip().startswith(b"1."):
        return None  # a2a-sdk answers by the version rule first
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    bad = [v for v in query.get("status", []) if not _valid_state(v)]
    if not bad:
        return None
    why = f"{bad[0][:64]!r} is not a TaskState"
    violation = {"field": "status", "description": why}
    detail = {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [violation]}
    error = {"code": 400, "status": "INVALID_ARGUMENT", "message": f"status: {why}", "details": [detail]}
    return orjson.dumps({"error": error})


def _invalid_params(request: dict[str, Any]) -> bytes | None:
    """A JSON-RPC -32602 answer for a 1.0 request a2a-sdk would wrongly accept, else None.

    A2A §3.3.2: "Servers MUST validate all input parameters before processing", with JSON-RPC
    ``-32602 Invalid params``. Caught here: a ``SendMessage`` message without its REQUIRED
    ``messageId`` or ``role``, and a ``ListTasks`` ``status`` that is not a TaskState.
    """
    if not isinstance(request.get("params"), dict):
        return None
    params, method, problem = request["params"], request.get("method"), None
    if method in ("SendMessage", "SendStreamingMessage") and isinstance(params.get("message"), dict):
        message = params["message"]
        missing = [f for f in ("messageId", "role") if not message.get(f)]
        if missing:
            problem = f"message.{missing[0]} is required"
        elif not _valid_role(message["role"]):
            problem = f"message.role: {str(message['role'])[:64]!r} is not a Role"
    elif method == "ListTasks" and "status" in params and not _valid_state(params["status"]):
        problem = f"status: {str(params['status'])[:64]!r} is not a TaskState"
    if problem is None:
        return None
    error = {"code": -32602, "message": f"Invalid params: {problem}"}
    return orjson.dumps({"jsonrpc": "2.0", "id": request.get("id"), "error": error})


def _valid_role(value: object) -> bool:
    if isinstance(value, str):
        return value in _ROLE_NAMES
    return isinstance(value, int) and not isinstance(value, bool) and value in _ROLE_NUMBERS


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


def _fast_send_message(request: Any, headers: dict[bytes, bytes]) -> dict[str, Any] | None:
    """The request, when it is a blocking 1.0 SendMessage the fast path may answer; else None."""
    # A2A §3.6.2: "Agents MUST interpret empty value as 0.3 version" (a2a-sdk's path too).
    version = headers.get(b"a2a-version", b"").strip()
    if not version.startswith(b"1."):
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


def _replay(body: bytes, receive: Receive, gone: asyncio.Event | None = None) -> Receive:
    """An ASGI ``receive`` that hands over a body already read, then the connection's own
    ``receive``: a streamed answer (``SendStreamingMessage``) watches it for the caller going
    away, and must not be told so at once. ``gone`` is set when the caller has gone."""
    sent = False

    async def replayed() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        message = dict(await receive())
        if message.get("type") == "http.disconnect" and gone is not None:
            gone.set()
        return message

    return replayed


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
