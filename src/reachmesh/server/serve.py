"""Serving the Router with uvicorn: one configuration for the command line and the tests.

The request head is bounded by :mod:`.h1`; SIGTERM starts one drain deadline
(``server.drain_timeout_seconds``) that covers requests in flight and accepted async requests
alike, so the process exits within it.
"""

from __future__ import annotations

import logging
import signal
import socket
import ssl
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from reachmesh.config import ServerPolicy
from reachmesh.exceptions import ConfigError
from reachmesh.server.app import RouterApp
from reachmesh.server.h1 import bounded_protocol

log = logging.getLogger("reachmesh.router")


def tls_settings(server: ServerPolicy) -> dict[str, str]:
    """uvicorn's ``ssl_certfile``/``ssl_keyfile`` when the policy serves HTTPS, else nothing.

    The pair is loaded here once, so a missing file or a key that does not match the certificate
    is a ConfigError naming the keys, before uvicorn binds (its own error would be a traceback).
    """
    if server.tls_cert_file is None or server.tls_key_file is None:
        return {}
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            server.tls_cert_file, server.tls_key_file
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"server.tls_cert_file / server.tls_key_file: cannot load "
            f"{server.tls_cert_file!r} with {server.tls_key_file!r}: {exc}"
        ) from exc
    return {"ssl_certfile": server.tls_cert_file, "ssl_keyfile": server.tls_key_file}


def uvicorn_config(app: RouterApp, host: str, port: int, **extra: Any) -> uvicorn.Config:
    """uvicorn's settings for ``app``, from its policy; ``extra`` overrides (e.g. ``loop``)."""
    server = app.config.server
    settings: dict[str, Any] = {
        "host": host,
        "port": port,
        "lifespan": "on",
        "access_log": False,
        "log_level": "warning",
        # uvicorn's own logging set-up would give its loggers handlers of their own, beside the
        # escaping one the entry point installs; left alone, its lines reach that one too.
        "log_config": None,
        "http": bounded_protocol(server),
        "server_header": False,
        "timeout_graceful_shutdown": server.drain_timeout_seconds,
        "backlog": server.listen_backlog,
        # X-Forwarded-For only from the policy's proxies, never from FORWARDED_ALLOW_IPS (which
        # uvicorn reads when this is unset): the header names the client the limits count.
        "proxy_headers": bool(server.trusted_proxies),
        "forwarded_allow_ips": list(server.trusted_proxies),
        **tls_settings(server),
        **extra,
    }
    return uvicorn.Config(app, **settings)


class RouterProcess(uvicorn.Server):
    """uvicorn's server, telling the app when a shutdown signal starts the drain."""

    def __init__(
        self, config: uvicorn.Config, app: RouterApp, on_ready: Callable[[], None] | None = None
    ) -> None:
        super().__init__(config)
        self.router_app = app
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_ready is not None:
            self._on_ready()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            # The operator's signal, said in the log: otherwise the process just goes quiet.
            drain = self.router_app.config.server.drain_timeout_seconds
            log.info("[router] %s received: draining for up to %g s, then stopping", _name(sig), drain)
        self.router_app.begin_drain(time.monotonic())
        super().handle_exit(sig, frame)


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """The Router's listening socket, bound here rather than by uvicorn: a taken port is then a
    ConfigError (one ``error:`` line), not uvicorn's own ``ERROR: [Errno 98]`` log record.

    SO_REUSEADDR as uvicorn sets it (a restart is not refused over TIME-WAIT connections);
    ``reuse_port`` adds SO_REUSEPORT: several worker processes listen on one port, and the
    kernel spreads connections over them.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind {host}:{port}: {(exc.strerror or str(exc)).lower()}") from exc
    return sock


def serve(
    app: RouterApp,
    host: str,
    port: int,
    *,
    on_ready: Callable[[], None] | None = None,
    reuse_port: bool = False,
    middleware: Callable[[RouterApp], Any] | None = None,
    **extra: Any,
) -> None:
    """Run the Router until SIGINT or SIGTERM (blocking; an entry point's call).

    ``on_ready`` runs once the port is bound and the app has started; ``reuse_port`` shares the
    port with other workers; ``middleware(app)`` is the ASGI app served in front of the Router
    (the A2A export), which must pass lifespan through.
    """
    sockets = [bind_socket(host, port, reuse_port=reuse_port)]
    process = RouterProcess(uvicorn_config(app, host, port, **extra), app, on_ready)
    if middleware is not None:
        process.config.app = middleware(app)
    process.run(sockets=sockets)
