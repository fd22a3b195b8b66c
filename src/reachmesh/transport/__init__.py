"""The Router's one HTTP edge: a transport contract of a few methods and its implementations.

:class:`~.base.Transport` is what the dispatcher, the health checker and async delivery call;
:class:`~.http.HttpTransport` is the implementation: forwarding goes through the pooled HTTP/1.1
client of :mod:`.pool`, the rare calls (probes, deliveries) through aiohttp; transport/ is the only
part of the Router that imports an HTTP client. ``reachmesh.testing.FakeTransport`` is the in-process double.
"""

from reachmesh.transport.base import AttemptLimits, Transport, classify_answer

__all__ = ["AttemptLimits", "Transport", "classify_answer"]
