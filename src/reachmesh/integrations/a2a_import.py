"""The A2A import: an A2A agent joins a Router by its agent card (the ``a2a`` extra).

:func:`import_agent` reads an A2A agent's card and registers it as a managed (lease-less) agent
with ``network.protocol: a2a``: its skills become capabilities, their descriptions and examples
feed the semantic index, and the Router's health checks probe the card. Forwarding to it is the
core's (``transport/a2a.py``); only the import needs this extra. The Router's own A2A face is
:mod:`reachmesh.integrations.a2a`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import httpx

from reachmesh.exceptions import ConfigError, RegistryError
from reachmesh.integrations import missing_extra
from reachmesh.protocol import MAX_CAPABILITIES, MAX_EXAMPLE_CHARS, MAX_EXAMPLES, AgentProfile
from reachmesh.sdk.routers import RouterList, request_any

try:
    from a2a.client import A2ACardResolver
    from a2a.types import AgentCard
    from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("a2a", exc) from exc

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
    card: AgentCard,
    card_url: str,
    *,
    agent_id: str | None = None,
    health_interval_s: float = 15.0,
    max_concurrency: int | None = None,
) -> AgentProfile:
    """The Reach profile of an A2A agent: skills as capabilities, the card as health check.
    ``max_concurrency`` is the profile's (protocol §15): an A2A card has no way to say how many
    calls the agent takes at once, so whoever imports it says it for the agent."""
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
    profile: dict[str, Any] = {
        "id": agent_id or agent_id_for(card),
        "display_name": card.name[:256],
        "network": {"protocol": "a2a", "endpoint": endpoint},
        "capabilities": capabilities,
        "health_check": health,
    }
    if max_concurrency is not None:
        profile["max_concurrency"] = max_concurrency
    try:
        return AgentProfile.model_validate(profile)
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
    max_concurrency: int | None = None,
) -> dict[str, Any]:
    """Read the A2A agent card at ``url`` and register the agent with the Router (managed).

    Returns the registration (``agentId``, ``leaseId``, ...) with the ``profile`` registered;
    the lease id is what removes it again (``DELETE /agents/{id}``). Needs an admin token when
    the Router has auth on. ``max_concurrency``: the most calls the Router sends it at once (the
    rest wait in the Router's queue, then ``OVERLOADED``); none means no bound.
    """
    own = http is None
    client = http or httpx.AsyncClient(timeout=10)
    try:
        card, card_url = await fetch_card(url, http=client)
        profile = profile_from_card(
            card,
            card_url,
            agent_id=agent_id,
            health_interval_s=health_interval_s,
            max_concurrency=max_concurrency,
        )
        body = {**profile.model_dump(mode="json"), "managed": True}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            routers = RouterList(router_url)
            _, resp = await request_any(client, routers, "POST", "/agents", json=body, headers=headers)
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


__all__ = ["agent_id_for", "card_location", "fetch_card", "import_agent", "jsonrpc_url", "profile_from_card"]
