"""The Router's one HTTP edge: a transport contract of a few methods and its implementations.

:class:`~.base.Transport` is what the dispatcher, the health checker and async delivery call;
:class:`~.http.HttpTransport` is the pooled aiohttp implementation, and the only Router module
that imports an HTTP client. ``reachmesh.testing.FakeTransport`` is the in-process double.
"""

from reachmesh.transport.base import AttemptLimits, Transport, classify_answer

__all__ = ["AttemptLimits", "Transport", "classify_answer"]
