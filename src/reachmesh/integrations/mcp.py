"""The Router's capabilities as MCP tools (mcp 2.x ``MCPServer``; the ``mcp`` extra; ``reach mcp``).

- One tool per routable task, its input schema the capability's ``input_schema`` as JSON
  Schema, its description the capability's (read from ``GET /admin/capabilities``).
- The list follows the registry live: :meth:`ReachMCP.watch` re-reads the catalogue every
  ``poll_interval_s`` and, when the set of tools changed, sends
  ``notifications/tools/list_changed``: on ``subscriptions/listen`` streams (MCP 2026-07-28)
  and to every handshake-era session that listed tools.
- Tool names never change when a second agent serves a task: a name is a function of the task
  alone (:func:`tool_name`).
- A call is one ReachRequest through the Router, with its routing, failover and breakers; a
  result comes back as structured content (a string result as that text), a failure as an
  error result with the ReachResponse's status and error. A tool that is not listed is a
  protocol error (-32602, invalid params), as the schema lists for an unknown tool.
- Over HTTP, header values lose their surrounding whitespace before the SDK reads them
  (RFC 9110 §5.5), with ``tokens`` every request needs a bearer token, and a request body over
  ``max_body_bytes`` is refused 413 before the SDK reads it whole (:meth:`http_app`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Sequence
from typing import Any

import httpx
import orjson

from reachmesh.exceptions import ConfigError, RouterUnavailable
from reachmesh.integrations import described, missing_extra, tool_name
from reachmesh.protocol import ReachResponse
from reachmesh.redaction import loggable
from reachmesh.sdk import ReachClient
from reachmesh.sdk.auth import auth_headers
from reachmesh.sdk.routers import RouterList, request_any
from reachmesh.version import __version__

try:
    import anyio
    from mcp.server.connection import Connection
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.server.lowlevel.server import NotificationOptions
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.context import Context
    from mcp.server.models import InitializationOptions
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError
    from mcp.shared.subscriptions import ToolsListChanged
    from mcp_types import INVALID_PARAMS, CallToolResult, ListToolsResult, PaginatedRequestParams, TextContent
    from mcp_types import Tool as MCPTool
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("mcp", exc) from exc

log = logging.getLogger("reachmesh.mcp")

_ANY_OBJECT: dict[str, Any] = {"type": "object"}

# The request body the HTTP bridge takes at most. The SDK reads each POST whole before parsing
# it, and nothing else bounded it: one POST of any size was held in the bridge's memory. Twice
# the Router's default body limit (server.body_limit_bytes, 1 MiB): room for the JSON-RPC
# envelope around arguments the Router would take (``reach mcp --max-body-bytes`` for more).
MAX_BODY_BYTES = 2 * 1024 * 1024


def tools_from(rows: list[dict[str, Any]]) -> dict[str, MCPTool]:
    """The tools for a capability catalogue, by name."""
    tools: dict[str, MCPTool] = {}
    for row in rows:
        name = tool_name(row["task"])
        description = described(row, f"Agent-Reach task {row['task']}")
        tools[name] = MCPTool(
            name=name,
            title=row["task"],
            description=description,
            input_schema=row["inputSchema"] or _ANY_OBJECT,
            _meta={"agent-reach/task": row["task"]},
        )
    return tools


class ReachMCP(MCPServer):
    """An MCP server whose tools are the Router's capabilities, called through the Router."""

    def __init__(
        self,
        router_url: str,
        *,
        poll_interval_s: float = 1.0,
        timeout_ms: int | None = None,
        name: str = "agent-reach",
    ) -> None:
        # MCPServer's constructor calls logging.basicConfig (a Rich handler on the root logger at
        # INFO). A library must not change the process's logging: put the root logger back.
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        super().__init__(
            name=name,
            version=__version__,
            instructions="Each tool is a task routed by an Agent-Reach Router.",
        )
        root.handlers[:] = handlers
        root.setLevel(level)
        # One Router, or several comma-separated: the catalogue is read from whichever answers.
        self.routers = RouterList(router_url)
        self.router_url = self.routers.describe()
        self.poll_interval_s = poll_interval_s
        self.timeout_ms = timeout_ms
        self.tools: dict[str, MCPTool] = {}
        self._tasks: dict[str, str] = {}  # tool name -> task
        # Handshake-era connections, held strongly while open: each drops itself on close.
        self._connections: set[Connection] = set()
        self._client: ReachClient | None = None
        self._http: httpx.AsyncClient | None = None
        self.changes = 0  # how many list changes were announced (for tests and logs)
        self._failing: str | None = None  # the failure last logged by poll(), until it ends
        self._declare_list_changed()
        self.middleware.append(self._track_connection)

    @property
    def sessions(self) -> int:
        """How many handshake-era client connections are open (and told of list changes)."""
        return len(self._connections)

    def _declare_list_changed(self) -> None:
        """Declare ``tools.listChanged`` on every transport, the HTTP sessions included.

        The SDK's HTTP session manager builds each session's initialize answer from
        ``create_initialization_options()`` with no notification options (so ``false``); the
        bridge does send the notification, so its default must say so.
        """
        lowlevel = self._lowlevel_server
        declare = lowlevel.create_initialization_options

        def with_list_changed(
            notification_options: NotificationOptions | None = None,
            experimental_capabilities: dict[str, dict[str, Any]] | None = None,
            extensions: dict[str, dict[str, Any]] | None = None,
        ) -> InitializationOptions:
            options = notification_options or NotificationOptions(tools_changed=True)
            return declare(options, experimental_capabilities, extensions)

        lowlevel.create_initialization_options = with_list_changed  # type: ignore[method-assign]

    async def _track_connection(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Remember each handshake-era connection from its first message after ``initialize``.

        The SDK's session object lives for one request; the connection lives as long as the
        client, so that is what is held (strongly: a weak reference is gone before the next
        change), and its own teardown removes it. A 2026-07-28 client is not held: it listens
        for changes on ``subscriptions/listen``.
        """
        if ctx.method != "initialize" and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            # ServerSession exposes its connection only privately in mcp 2.x.
            connection = getattr(ctx.session, "_connection", None)
            if isinstance(connection, Connection) and connection not in self._connections:
                self._connections.add(connection)
                connection.exit_stack.callback(self._connections.discard, connection)
        return await call_next(ctx)

    # -- the tool list -----------------------------------------------------------------------

    async def list_tools(self) -> list[MCPTool]:
        return list(self.tools.values())

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        tool = self.tools.get(name)
        return None if tool is None else tool.input_schema

    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=await self.list_tools())

    async def refresh(self) -> bool:
        """Re-read the catalogue; True (and list_changed sent) when the tools changed."""
        if self._http is None:
            self._http = httpx.AsyncClient(headers=auth_headers(), timeout=10)
        where = f"{self.routers.current}/admin/capabilities"
        try:
            used, resp = await request_any(self._http, self.routers, "GET", "/admin/capabilities")
            where = f"{used}/admin/capabilities"
            rows = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            raise RouterUnavailable(f"cannot read {where}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code in (401, 403):
            raise ConfigError(
                f"reach mcp reads {where}, an admin endpoint, and the Router answered HTTP "
                f"{resp.status_code}{_said(resp)}: set REACH_TOKEN to an admin token"
            )
        if not isinstance(rows, list):
            raise RouterUnavailable(f"cannot read {where}: HTTP {resp.status_code}{_said(resp)}")
        tools = tools_from(rows)
        if tools == self.tools:
            return False
        self.tools = tools
        self._tasks = {tool_name(row["task"]): row["task"] for row in rows}
        self.changes += 1
        await self._announce()
        return True

    async def _announce(self) -> None:
        await self._subscriptions.publish(ToolsListChanged())
        for connection in list(self._connections):
            # Best effort by design: a connection whose stream is gone drops it.
            await connection.send_tool_list_changed()

    async def watch(self) -> None:
        """Follow the registry until cancelled; a Router that does not answer keeps the last list."""
        while True:
            await self.poll()
            await asyncio.sleep(self.poll_interval_s)

    async def poll(self) -> None:
        """One re-read of the catalogue. A failure is logged when it starts or changes, and its
        end once, never on every poll (one a second would bury everything else)."""
        try:
            await self.refresh()
        except (RouterUnavailable, ConfigError) as exc:
            if exc.message != self._failing:
                log.warning("[reach-mcp] %s; keeping the last tool list, still trying", exc.message)
                self._failing = exc.message
            return
        if self._failing is not None:
            log.info("[reach-mcp] %s/admin/capabilities answers again", self.routers.current)
            self._failing = None

    # -- calls -------------------------------------------------------------------------------

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult:
        task = self._tasks.get(name)
        if task is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {name}", {"name": name})
        if self._client is None:
            self._client = ReachClient(self.router_url, source_agent="mcp")
        options: dict[str, Any] = {} if self.timeout_ms is None else {"timeout_ms": self.timeout_ms}
        try:
            if context is not None and _progress_wanted(context):
                reply, result = await _streamed(self._client, task, arguments, options, context)
            else:
                reply = await self._client.call(task, arguments, **options)
                result = reply.result
        except RouterUnavailable as exc:
            return _error_result(exc.message, {"status": "ROUTER_UNAVAILABLE"})
        if reply.ok:
            structured = result if isinstance(result, dict) else {"result": result}
            text = result if isinstance(result, str) else orjson.dumps(result).decode()
            return CallToolResult(
                content=[TextContent(type="text", text=text)], structured_content=structured
            )
        error = reply.error.model_dump(by_alias=True, exclude_none=True) if reply.error else {}
        message = f"{reply.status}: {error.get('message', '')}"
        if error.get("retryAfterSeconds") is not None:
            # The text is what a model reads: busy is worth trying again, and when.
            message += f" (busy, not broken: try again in {error['retryAfterSeconds']} s)"
        return _error_result(
            message, {"status": str(reply.status), "traceId": reply.trace_id, "error": error}
        )

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context[Any, Any] | None = None
    ) -> Any:
        """The bridge serves tools only: every prompt name is unknown (-32602, invalid params)."""
        raise MCPError(INVALID_PARAMS, f"Unknown prompt: {name}", {"name": name})

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._http is not None:
            await self._http.aclose()

    # -- serving -----------------------------------------------------------------------------

    async def serve_stdio(self) -> None:
        """Serve MCP on stdin/stdout while following the registry (``reach mcp``)."""
        await self._first_list()
        async with stdio_server() as (read, write), anyio.create_task_group() as group:
            group.start_soon(self.watch)
            options = self._lowlevel_server.create_initialization_options(
                NotificationOptions(tools_changed=True)
            )
            await self._lowlevel_server.run(read, write, options)
            group.cancel_scope.cancel()
        await self.aclose()

    async def serve_http(
        self,
        host: str,
        port: int,
        path: str = "/mcp",
        *,
        tokens: Sequence[str] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        """Serve MCP over streamable HTTP at ``http://host:port{path}`` (``reach mcp --http``).

        With ``tokens``, every request must carry one as ``Authorization: Bearer``: the bridge
        calls the Router with its own credentials, so whoever reaches it acts with them.
        """
        import uvicorn

        await self._first_list()
        app = self.http_app(path, host=host, tokens=tokens, max_body_bytes=max_body_bytes)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        watcher = asyncio.create_task(self.watch())
        try:
            await server.serve()
        finally:
            watcher.cancel()
            await self.aclose()

    def http_app(
        self,
        path: str = "/mcp",
        *,
        host: str = "127.0.0.1",
        tokens: Sequence[str] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> Any:
        """The streamable-HTTP ASGI app ``serve_http`` serves: the SDK's, with header values
        stripped of surrounding whitespace, its request bodies bounded by ``max_body_bytes``, behind
        a bearer-token check when ``tokens`` is set (so a stranger's body is not even read)."""
        app: Any = _StrippedHeaders(self.streamable_http_app(streamable_http_path=path, host=host))
        app = _BoundedBody(app, max_body_bytes)
        return _BearerOnly(app, tokens) if tokens else app

    async def _first_list(self) -> None:
        """The first read: a Router away is waited for; refused credentials are final (raised)."""
        try:
            await self.refresh()
        except RouterUnavailable as exc:
            log.warning("[reach-mcp] %s; starting with no tools", exc.message)
            self._failing = exc.message


class _StrippedHeaders:
    """ASGI: header values without leading or trailing spaces and tabs.

    RFC 9110 §5.5: "a field parsing implementation MUST exclude such whitespace prior to
    evaluating the field value". The HTTP server hands values on as sent and the SDK compares
    ``Mcp-Name`` and ``Mcp-Method`` with the body byte for byte, so they are stripped here.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = [(name, value.strip(b" \t")) for name, value in scope.get("headers", ())]
            scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)


class _BoundedBody:
    """ASGI: a request body over ``limit`` bytes is answered 413 before the app sees it: at once
    from its Content-Length, else once the bytes read pass the limit. A body within it is read
    here and handed on whole; later ``receive`` calls (a disconnect) go to the server's."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _content_length(scope) > self.limit:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body was whole: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        whole: dict[str, Any] | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> dict[str, Any]:
            nonlocal whole
            if whole is None:
                return await receive()  # type: ignore[no-any-return]
            message, whole = whole, None
            return message

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        message = f"the request body is over the bridge's {self.limit} bytes (reach mcp --max-body-bytes)"
        body = orjson.dumps({"error": {"code": "PAYLOAD_TOO_LARGE", "message": message}})
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: dict[str, Any]) -> int:
    """The request's declared Content-Length, 0 when it gives none (the HTTP server has refused
    one that is not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


class _BearerOnly:
    """ASGI: answer 401 unless the request carries one of ``tokens`` (compared in constant time)."""

    def __init__(self, app: Any, tokens: Sequence[str]) -> None:
        self.app = app
        self._digests = [hashlib.sha256(t.encode()).digest() for t in tokens]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self._allowed(scope):
            body = (
                b'{"error":{"code":"UNAUTHORIZED","message":"a bearer token (REACH_MCP_TOKEN) is required"}}'
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: dict[str, Any]) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = hashlib.sha256(value[7:].strip()).digest()
                return any(hmac.compare_digest(given, d) for d in self._digests)
        return False


def _progress_wanted(context: Context[Any, Any]) -> bool:
    """Whether the client gave a progress token with this call (``_meta.progressToken``)."""
    try:
        meta = context.request_context.meta
    except (ValueError, AttributeError):
        return False
    if meta is None:
        return False
    # A TypedDict in the mcp package (``progress_token``); the wire's own spelling too, in case
    # a transport hands the raw map on.
    return meta.get("progress_token", meta.get("progressToken")) is not None


async def _streamed(
    client: ReachClient,
    task: str,
    arguments: dict[str, Any],
    options: dict[str, Any],
    context: Context[Any, Any],
) -> tuple[ReachResponse, Any]:
    """A streamed call (protocol §14) whose chunks go to the client as progress notifications,
    each with the chunk as its message, as they come. The tool's result is the agent's final
    result; without one, its one chunk (a plain agent's whole answer) or the list of chunks."""
    chunks: list[Any] = []
    async with client.stream(task, arguments, **options) as answer:
        async for chunk in answer:
            chunks.append(chunk)
            text = chunk if isinstance(chunk, str) else orjson.dumps(chunk).decode()
            await context.report_progress(len(chunks), None, text)
    reply = answer.response
    if reply.result is not None:
        return reply, reply.result
    return reply, chunks[0] if len(chunks) == 1 else chunks


def _said(resp: httpx.Response) -> str:
    """``" CODE: message"`` from a Router's error body, bounded; nothing when it has none."""
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    said = f" {error.get('code', '')}: {error.get('message', '')}".rstrip(": ")
    return loggable(said, 300)


def _error_result(message: str, detail: dict[str, Any]) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=message)], structured_content=detail, is_error=True
    )


__all__ = ["ReachMCP", "tool_name", "tools_from"]
