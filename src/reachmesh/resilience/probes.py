"""Active health checks: probe each agent's ``health_check`` path on its own schedule.

One failure makes an agent ``suspect``; ``unhealthy_after`` in a row make it ``unhealthy`` (out
of routing); one success brings it back. Probes go to the dedicated health port when the profile
has one, so a busy-but-alive agent keeps answering. Each agent's schedule is jittered, so a
thousand agents registered together are not probed in the same millisecond.

An agent has at most one probe in flight: when its next probe falls due while the last one is
still waiting or running, that turn is skipped rather than queued, so a slow agent or a short
interval cannot pile up work behind the shared ``concurrency`` gate and starve the others'
probes. An agent's probe is cancelled when it leaves the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from reachmesh.clock import SYSTEM_CLOCK, Clock
from reachmesh.config import HealthPolicy
from reachmesh.lifecycle import Background
from reachmesh.protocol import AgentStatusValue
from reachmesh.registry.base import AgentEntry, Registry, RegistryEvent
from reachmesh.transport.base import Transport

log = logging.getLogger("reachmesh.health")

ProbeListener = Callable[[str, bool], None]
_jitter = random.Random()


def health_url(entry: AgentEntry) -> str:
    """Where to probe: the profile's health path, on its dedicated port if it has one."""
    endpoint = urlsplit(entry.endpoint)
    check = entry.profile.health_check
    port = check.port or endpoint.port
    host = endpoint.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port else host
    return f"{endpoint.scheme}://{netloc}{check.path}"


class HealthChecker:
    """Schedules and runs probes; writes conclusions to the registry with ``set_health``."""

    def __init__(
        self,
        registry: Registry,
        transport: Transport,
        policy: HealthPolicy | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.registry = registry
        self.transport = transport
        self.policy = policy or HealthPolicy()
        self._clock = clock
        self._due: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._listeners: list[ProbeListener] = []
        self._scheduler = Background("reach-health")
        self._probes = Background("reach-health-probe")
        self._wake = asyncio.Event()
        # agent id -> its probe in flight (waiting for the gate or running): one per agent at most.
        self._running: dict[str, asyncio.Task[None]] = {}
        registry.subscribe(self._on_registry)

    def apply(self, policy: HealthPolicy) -> None:
        """Take a reloaded policy; each agent's next probe follows it."""
        self.policy = policy

    @property
    def probes_in_flight(self) -> int:
        return len(self._running)

    def subscribe(self, listener: ProbeListener) -> None:
        """Call ``listener(agent_id, ok)`` after every probe."""
        self._listeners.append(listener)

    def _interval(self, entry: AgentEntry) -> float:
        return self.policy.interval_seconds or entry.profile.health_check.interval_seconds

    def _on_registry(self, event: RegistryEvent, entry: AgentEntry) -> None:
        if event in (RegistryEvent.REGISTERED, RegistryEvent.REPLACED):
            # First probe at a random point of the first interval: spreads a burst of registrations.
            self._due[entry.id] = self._clock.monotonic() + _jitter.uniform(0.1, 1.0) * self._interval(entry)
            self._failures.pop(entry.id, None)
            self._wake.set()
        elif event in (RegistryEvent.DEREGISTERED, RegistryEvent.REMOVED):
            self._due.pop(entry.id, None)
            self._failures.pop(entry.id, None)
            running = self._running.pop(entry.id, None)
            if running is not None:
                running.cancel()

    async def start(self) -> None:
        if self.policy.enabled and not self._scheduler:
            self._scheduler.spawn(self._run())

    async def close(self) -> None:
        await self._scheduler.close()
        await self._probes.close()

    async def _run(self) -> None:
        gate = asyncio.Semaphore(self.policy.concurrency)
        while True:
            now = self._clock.monotonic()
            for agent_id, due in list(self._due.items()):
                if due > now:
                    continue
                entry = self.registry.get(agent_id)
                if entry is None:
                    self._due.pop(agent_id, None)
                    continue
                jitter = 1 + _jitter.uniform(-self.policy.jitter, self.policy.jitter)
                self._due[agent_id] = now + self._interval(entry) * jitter
                if entry.lease_status is AgentStatusValue.OFFLINE or agent_id in self._running:
                    continue
                task = self._probes.spawn(self._probe(entry, gate))
                self._running[agent_id] = task
                task.add_done_callback(partial(self._release, agent_id))
            wait = min(self._due.values(), default=now + 1.0) - now
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(max(wait, 0.01), 1.0))

    def _release(self, agent_id: str, task: asyncio.Task[Any]) -> None:
        if self._running.get(agent_id) is task:
            del self._running[agent_id]

    async def _probe(self, entry: AgentEntry, gate: asyncio.Semaphore) -> None:
        timeout_ms = self.policy.timeout_ms or entry.profile.health_check.timeout_ms
        async with gate:
            ok = await self.probe_once(health_url(entry), timeout_ms / 1000)
        if self.registry.get(entry.id) is entry:
            self.observe(entry.id, ok)

    async def probe_once(self, url: str, timeout_s: float) -> bool:
        """One GET of ``url``: True on any 2xx within ``timeout_s``."""
        return await self.transport.probe(url, timeout_s)

    def observe(self, agent_id: str, ok: bool) -> None:
        """Fold one probe result into the agent's health."""
        if ok:
            self._failures.pop(agent_id, None)
            self.registry.set_health(agent_id, AgentStatusValue.AVAILABLE)
        else:
            failures = self._failures.get(agent_id, 0) + 1
            self._failures[agent_id] = failures
            health = (
                AgentStatusValue.UNHEALTHY
                if failures >= self.policy.unhealthy_after
                else AgentStatusValue.SUSPECT
            )
            self.registry.set_health(agent_id, health)
        for listener in self._listeners:
            listener(agent_id, ok)
