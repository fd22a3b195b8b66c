"""The capability catalogue: what the Router can route, one row per task, for the bridges.

``GET /admin/capabilities`` serves it; the A2A card (skills), the MCP server (tools) and the
AutoGen tools are built from it. A task is listed while at least one agent declaring it is not
offline. When several agents declare a task, the first by agent id gives the description and
schemas, so a row (and a tool built from it) does not change when a second agent joins. A task's
``limits`` are every limit its agents declare, as routing by meaning applies them.
"""

from __future__ import annotations

from typing import Any

from reachmesh.protocol import MAX_EXAMPLES, MAX_LIMITS, AgentStatusValue
from reachmesh.registry.base import Registry
from reachmesh.schema import to_json_schema


def catalog(registry: Registry) -> list[dict[str, Any]]:
    """Every listed task, sorted by name: description, examples, JSON Schemas and its agents."""
    rows: list[dict[str, Any]] = []
    for task in sorted(registry.tasks()):
        entries = sorted(
            (e for e in registry.by_task(task) if e.status is not AgentStatusValue.OFFLINE),
            key=lambda e: e.id,
        )
        if not entries:
            continue
        first = entries[0].capabilities[task]
        described = next((e.capabilities[task] for e in entries if e.capabilities[task].description), first)
        examples: dict[str, None] = {}
        limits: dict[str, None] = {}
        for entry in entries:
            examples.update(dict.fromkeys(entry.capabilities[task].examples))
            limits.update(dict.fromkeys(entry.capabilities[task].limits))
        rows.append(
            {
                "task": task,
                "description": described.description,
                "examples": list(examples)[:MAX_EXAMPLES],
                "limits": list(limits)[:MAX_LIMITS],
                "inputSchema": to_json_schema(first.input_schema) if first.input_schema else None,
                "outputSchema": to_json_schema(first.output_schema) if first.output_schema else None,
                "agents": [e.id for e in entries],
            }
        )
    return rows
