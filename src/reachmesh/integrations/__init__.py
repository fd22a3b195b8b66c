"""Bridges to the frameworks agents already live in: LangGraph, AutoGen, A2A and MCP.

Each module is an optional extra (``pip install reachmesh[langgraph]``, ``[autogen]``,
``[a2a]``, ``[mcp]``) and imports its framework only when the module itself is imported, so
the core never needs any of them. Nothing is imported here for the same reason.

- :mod:`.langgraph`: ``reach_node`` (a graph node that calls the Router) and ``graph_agent``.
- :mod:`.autogen`: ``router_tools`` (capabilities as AssistantAgent tools) and ``autogen_agent``.
- :mod:`.a2a`: ``A2AExport`` (the Router as an A2A server).
- :mod:`.a2a_import`: ``import_agent`` (an A2A agent into the registry by its card; forwarding
  to it needs no extra, see ``transport/a2a.py``).
- :mod:`.mcp`: ``ReachMCP`` (the Router's capabilities as live MCP tools; ``reach mcp``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from reachmesh.exceptions import ConfigError

if TYPE_CHECKING:
    from reachmesh.sdk import ReachAgent, ReachClient

# Closers parked until their loop shuts down; held here so none is collected (and run) early.
_PARKED: set[AsyncGenerator[None, None]] = set()


async def close_with_loop(client: ReachClient) -> ReachClient:
    """Close ``client`` when the running event loop shuts down, and return it.

    A bridge that makes its own client (the graph author or the AutoGen user gave none) has no
    moment to close it. An async generator parked at its first ``yield`` gives one:
    ``asyncio.run`` finalizes pending async generators before closing the loop, so the session
    is closed then, with no "Unclosed client session" at exit.
    """

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            _PARKED.discard(parked)
            await client.aclose()

    parked = closer()
    _PARKED.add(parked)
    await parked.__anext__()
    return client


class LoopClients:
    """A bridge's own ReachClient, one per event loop, each closed when its loop shuts down.

    aiohttp makes its session inside the running loop, and a graph or a tool may be run by
    several ``asyncio.run`` calls in turn: a client made in one loop cannot serve the next.
    """

    def __init__(self, router_url: str | None, source_agent: str) -> None:
        self.router_url = router_url
        self.source_agent = source_agent
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: ReachClient | None = None

    async def get(self) -> ReachClient:
        from reachmesh.sdk import ReachClient

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            client = ReachClient(self.router_url, source_agent=self.source_agent)
            self._client, self._loop = await close_with_loop(client), loop
        return self._client


# What tool-calling APIs accept as a name: MCP allows dots too; OpenAI-style functions do not.
_PLAIN = {True: re.compile(r"^[A-Za-z0-9_.-]{1,64}$"), False: re.compile(r"^[A-Za-z0-9_-]{1,64}$")}
_NOT_PLAIN = {True: re.compile(r"[^A-Za-z0-9_.-]+"), False: re.compile(r"[^A-Za-z0-9_-]+")}


def tool_name(task: str, *, dots: bool = True) -> str:
    """The tool name of a task: the task itself where the API allows it, else a stable slug.

    A slug is the task's ASCII letters and digits plus 8 hex digits of its SHA-256, so two tasks
    never share a name and a name depends on nothing but its task: a second agent serving the
    task, or a change of its description, never renames the tool.
    """
    if _PLAIN[dots].match(task):
        return task
    ascii_part = _NOT_PLAIN[dots].sub("_", task).strip("_")[:40] or "task"
    return f"{ascii_part}_{hashlib.sha256(task.encode()).hexdigest()[:8]}"


def missing_extra(extra: str, exc: ImportError) -> ConfigError:
    """The error for a bridge whose package is not installed, naming the extra to install."""
    return ConfigError(
        f"the {extra} bridge needs its optional dependencies: pip install 'reachmesh[{extra}]' ({exc})"
    )


def single_capability_agent(
    agent_id: str,
    endpoint: str,
    capability: dict[str, Any],
    router_url: str | None,
    source: str,
    max_concurrency: int | None = None,
) -> ReachAgent:
    """A Reach agent serving one ``capability``: how a framework's graph or agent joins a Router.
    ``max_concurrency`` is declared in its profile, so the Router queues what it cannot take."""
    from reachmesh.sdk import AgentConfig, ReachAgent

    mapping: dict[str, Any] = {
        "agent": {"id": agent_id, "network": {"endpoint": endpoint}, "capabilities": [capability]}
    }
    if router_url is not None:
        mapping["router"] = {"url": router_url}
    return ReachAgent(AgentConfig.from_mapping(mapping, source=source), max_concurrency=max_concurrency)


def described(row: dict[str, Any], fallback: str) -> str:
    """A row's description for a tool or a skill, with what it does not handle when it says so:
    a model choosing a tool reads the limits where it reads the description."""
    text = row["description"] or fallback
    limits = row.get("limits") or []
    if limits:
        text = f"{text.rstrip()} Does not handle: {'; '.join(limits)}."
    return text
