"""AutoGen through the Router (autogen-agentchat 0.7; the ``autogen`` extra).

- :func:`router_tools` makes each Router capability a tool an ``AssistantAgent`` can call; the
  tool's JSON schema is the capability's ``input_schema``, and a call is one ReachRequest with
  the Router's routing and resilience. A failed call returns ``{"status", "error"}`` to the
  model (it can read and recover) instead of raising.
- :func:`autogen_agent` registers an AutoGen agent (anything with ``run(task=...)``) as a Reach
  agent with one capability, in one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, ConfigDict

from reachmesh.exceptions import RouterUnavailable
from reachmesh.integrations import LoopClients, missing_extra, single_capability_agent, tool_name
from reachmesh.sdk import ReachAgent, ReachClient
from reachmesh.sdk.auth import auth_headers
from reachmesh.sdk.client import router_url_from_env
from reachmesh.sdk.routers import RouterList, request_any

try:
    from autogen_core import CancellationToken
    from autogen_core.tools import BaseTool, ParametersSchema, ToolSchema
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("autogen", exc) from exc


class Arguments(BaseModel):
    """Whatever the model passes: the Router checks it against the capability's schema."""

    model_config = ConfigDict(extra="allow")


class ReachTool(BaseTool[Arguments, Any]):
    """One Router capability as an AutoGen tool."""

    def __init__(
        self, row: dict[str, Any], client: ReachClient | LoopClients, *, timeout_ms: int | None = None
    ) -> None:
        """``client`` is the caller's own ReachClient, or the bridge's (one per event loop)."""
        self.task: str = row["task"]
        description = row["description"] or f"Agent-Reach task {self.task}"
        super().__init__(Arguments, dict, tool_name(self.task, dots=False), description)
        self._input_schema: dict[str, Any] | None = row["inputSchema"]
        self._client = client
        self._timeout_ms = timeout_ms

    @property
    def schema(self) -> ToolSchema:
        """The capability's ``input_schema`` as the function's parameters."""
        source = self._input_schema or {}
        parameters: dict[str, Any] = {k: v for k, v in source.items() if k != "$schema"}
        parameters["type"] = "object"
        parameters.setdefault("properties", {})
        # ParametersSchema is a TypedDict of the four usual keys; a JSON Schema may carry more
        # ($defs, descriptions), and the model should see them all.
        schema_: ParametersSchema = parameters  # type: ignore[assignment]
        return ToolSchema(name=self.name, description=self.description, parameters=schema_)

    async def run(self, args: Arguments, cancellation_token: CancellationToken) -> Any:
        options: dict[str, Any] = {} if self._timeout_ms is None else {"timeout_ms": self._timeout_ms}
        client = self._client if isinstance(self._client, ReachClient) else await self._client.get()
        # Linked to the token, so cancelling the run closes the call (and the Router closes its
        # connection to the agent) instead of leaving it to run to its timeout.
        call = asyncio.ensure_future(client.call(self.task, args.model_dump(), **options))
        cancellation_token.link_future(call)
        reply = await call
        if reply.ok:
            return reply.result
        error = reply.error.model_dump(by_alias=True, exclude_none=True) if reply.error else None
        return {"status": str(reply.status), "error": error}

    def return_value_as_string(self, value: Any) -> str:
        return value if isinstance(value, str) else orjson.dumps(value).decode()


async def router_tools(
    router_url: str | None = None,
    *,
    client: ReachClient | None = None,
    tasks: Collection[str] | None = None,
    timeout_ms: int | None = None,
) -> list[ReachTool]:
    """A tool per capability the Router routes now (``tasks`` narrows them), from
    ``GET /admin/capabilities``. Calls go through ``client``; without one, through the bridge's
    own (as ``autogen``), one per event loop, so the tools work from any ``asyncio.run``."""
    url = client.routers.describe() if client is not None else router_url_from_env(router_url)
    try:
        async with httpx.AsyncClient(headers=auth_headers(), timeout=10) as http:
            _, resp = await request_any(http, RouterList(url), "GET", "/admin/capabilities")
            resp.raise_for_status()
            rows = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise RouterUnavailable(f"cannot read {url}/admin/capabilities: {exc!r}") from exc
    caller = client or LoopClients(url, "autogen")
    return [
        ReachTool(row, caller, timeout_ms=timeout_ms) for row in rows if tasks is None or row["task"] in tasks
    ]


def autogen_agent(
    agent: Any,
    *,
    agent_id: str,
    task: str,
    endpoint: str,
    router_url: str | None = None,
    description: str = "",
    examples: Sequence[str] = (),
) -> ReachAgent:
    """A Reach agent whose capability ``task`` runs the AutoGen ``agent`` on the payload's text.

    The payload's ``text`` (else its JSON) is the AutoGen task; the answer is
    ``{"text": <last message>, "messages": <count>}``. Runs are serialised: an AutoGen agent
    keeps one conversation state and is not safe to run twice at once, so the profile declares
    ``max_concurrency: 1``: the Router queues the calls it cannot take yet (and answers
    ``OVERLOADED`` past its queue) instead of sending them to wait here, where the wait would
    run out the attempt's read timeout and be charged to the agent as a failure.
    """
    capability = {
        "task": task,
        "description": description or getattr(agent, "description", ""),
        "examples": list(examples),
        "input_schema": {"text": "string"},
    }
    reach = single_capability_agent(
        agent_id, endpoint, capability, router_url, f"autogen_agent({agent_id})", max_concurrency=1
    )
    lock = asyncio.Lock()

    @reach.capability(task)
    async def run_agent(payload: dict[str, Any]) -> dict[str, Any]:
        async with lock:
            result = await agent.run(task=payload["text"])
        messages = list(result.messages)
        last = messages[-1] if messages else None
        content = getattr(last, "content", "")
        text = content if isinstance(content, str) else str(content)
        return {"text": text, "messages": len(messages)}

    return reach


__all__ = ["ReachTool", "autogen_agent", "router_tools"]
