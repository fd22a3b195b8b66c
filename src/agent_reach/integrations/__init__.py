"""Bridges to the frameworks agents already live in: LangGraph, AutoGen, A2A and MCP.

Each module is an optional extra (``pip install agent-reach[langgraph]``, ``[autogen]``,
``[a2a]``, ``[mcp]``) and imports its framework only when the module itself is imported, so
the core never needs any of them. Nothing is imported here for the same reason.

- :mod:`.langgraph`: ``reach_node`` (a graph node that calls the Router) and ``graph_agent``.
- :mod:`.autogen`: ``router_tools`` (capabilities as AssistantAgent tools) and ``autogen_agent``.
- :mod:`.a2a`: ``A2AExport`` (the Router as an A2A server) and ``import_agent`` (an A2A agent
  into the registry; forwarding to it needs no extra, see ``transport/a2a.py``).
- :mod:`.mcp`: ``ReachMCP`` (the Router's capabilities as live MCP tools; ``reach mcp``).
"""

from __future__ import annotations

from agent_reach.exceptions import ConfigError


def missing_extra(extra: str, exc: ImportError) -> ConfigError:
    """The error for a bridge whose package is not installed, naming the extra to install."""
    return ConfigError(
        f"the {extra} bridge needs its optional dependencies: pip install 'agent-reach[{extra}]' ({exc})"
    )
