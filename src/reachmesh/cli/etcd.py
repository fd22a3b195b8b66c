"""Start etcd members as child processes on loopback: for ``reach demo --etcd``, tests and benches.

This needs the ``etcd`` binary (Debian: ``apt-get install etcd-server``). Each member gets free
ports and its own data directory; elections are tuned for loopback (100 ms heartbeats, 1 s
election timeout), so a killed leader is replaced within a few seconds.
"""

from __future__ import annotations

import base64
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reachmesh.exceptions import ConfigError
from reachmesh.ports import free_port
from reachmesh.registry.etcdclient import prefix_end


def loopback_tls(folder: Path, name: str) -> tuple[str, str, str]:
    """A fresh CA and a certificate for 127.0.0.1 in ``folder``, as ``(certificate, key, CA)``
    for :class:`EtcdCluster`'s ``tls``: for the tests and benches (trustme is a dev dependency)."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    files = {part: str(folder / f"{name}-{part}.pem") for part in ("cert", "key", "ca")}
    cert.cert_chain_pems[0].write_to_path(files["cert"])
    cert.private_key_pem.write_to_path(files["key"])
    ca.cert_pem.write_to_path(files["ca"])
    return files["cert"], files["key"], files["ca"]


def etcd_binary() -> str:
    """The path of ``etcd``; a ConfigError saying how to install it when it is missing."""
    found = shutil.which("etcd")
    if found is None:
        raise ConfigError("etcd is not installed: apt-get install etcd-server (or put etcd on PATH)")
    return found


@dataclass(eq=False)
class EtcdMember:
    """One etcd process; started, killed, frozen and thawed by the test or the demo."""

    name: str
    data_dir: Path
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    # Serve clients over TLS: (certificate, key, the CA file that verifies them). Peers stay on
    # plain loopback HTTP.
    tls: tuple[str, str, str] | None = None
    extra_args: Sequence[str] = ()

    @property
    def endpoint(self) -> str:
        return self.client_url if self.tls else f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"

    def verify_context(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=self.tls[2]) if self.tls else True

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str, *, state: str = "new") -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = (self.data_dir.parent / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(
            [
                etcd_binary(),
                "--name", self.name,
                "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.client_url,
                "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url,
                "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster,
                "--initial-cluster-state", state,
                "--initial-cluster-token", "agent-reach",
                "--heartbeat-interval", "100",
                "--election-timeout", "1000",
                "--logger", "zap",
                "--log-level", "warn",
                *(["--cert-file", self.tls[0], "--key-file", self.tls[1]] if self.tls else []),
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C meant for the demo must not stop etcd before the agents
            # have deregistered through the Routers; the owner stops it last.
            start_new_session=True,
        )  # fmt: skip
        log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 0.5) -> bool:
        try:
            answer = httpx.get(
                self.client_url + "/health", timeout=timeout, verify=self.verify_context()
            ).json()
        except (httpx.HTTPError, ValueError):
            return False
        return bool(answer.get("health") == "true")

    def member_id(self) -> str | None:
        try:
            answer = httpx.post(
                self.client_url + "/v3/maintenance/status", json={}, timeout=0.5, verify=self.verify_context()
            ).json()
        except (httpx.HTTPError, ValueError):
            return None
        return str(answer.get("header", {}).get("member_id")) if answer.get("leader") else None

    def is_leader(self) -> bool:
        try:
            answer = httpx.post(
                self.client_url + "/v3/maintenance/status", json={}, timeout=0.5, verify=self.verify_context()
            ).json()
        except (httpx.HTTPError, ValueError):
            return False
        return bool(answer.get("leader")) and answer["leader"] == answer.get("header", {}).get("member_id")

    def kill(self) -> None:
        """SIGKILL, and wait for it: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def freeze(self) -> None:
        """SIGSTOP: the process holds its sockets but answers nothing (a hung member)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen process cannot act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class EtcdCluster:
    """``size`` members on loopback sharing one cluster; ``endpoints`` is REACH_ETCD_ENDPOINTS."""

    def __init__(
        self,
        base: Path,
        size: int = 1,
        *,
        tls: tuple[str, str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.members = [
            EtcdMember(f"m{i}", base / f"m{i}", tls=tls, extra_args=extra_args) for i in range(size)
        ]
        self.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.members)

    def start(self, timeout: float = 20.0) -> EtcdCluster:
        for member in self.members:
            member.start(self.initial_cluster)
        self.wait_healthy(timeout)
        return self

    def restart(self, member: EtcdMember, timeout: float = 20.0) -> None:
        """Start a killed member again on its old data (it rejoins the cluster)."""
        member.start(self.initial_cluster, state="existing")
        self.wait_healthy(timeout, [member])

    def wait_healthy(self, timeout: float = 20.0, members: list[EtcdMember] | None = None) -> None:
        end = time.monotonic() + timeout
        for member in members or self.members:
            while not member.healthy():
                if not member.running:
                    raise RuntimeError(f"etcd member {member.name} exited; see {member.data_dir.parent}")
                if time.monotonic() > end:
                    raise RuntimeError(f"etcd member {member.name} not healthy after {timeout} s")
                time.sleep(0.05)

    def secure(self, root_password: str, users: Mapping[str, tuple[str, str, str]]) -> None:
        """Turn etcd's authentication on, as an operator would: a root user, then each user
        ``name -> (password, key prefix, READ | WRITE | READWRITE)`` with a role of its name."""
        member = self.members[0]
        with httpx.Client(base_url=member.client_url, verify=member.verify_context(), timeout=10) as http:

            def call(path: str, body: dict[str, Any]) -> None:
                answer = http.post(path, json=body).json()
                if "code" in answer:
                    raise RuntimeError(f"etcd {path}: {answer.get('message')}")

            call("/v3/auth/user/add", {"name": "root", "password": root_password})
            call("/v3/auth/role/add", {"name": "root"})
            call("/v3/auth/user/grant", {"user": "root", "role": "root"})
            for name, (password, prefix, kind) in users.items():
                span = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
                call("/v3/auth/role/add", {"name": name})
                call("/v3/auth/role/grant", {"name": name, "perm": {"permType": kind, **span}})
                call("/v3/auth/user/add", {"name": name, "password": password})
                call("/v3/auth/user/grant", {"user": name, "role": name})
            call("/v3/auth/enable", {})

    def leader(self) -> EtcdMember | None:
        return next((m for m in self.members if m.running and m.is_leader()), None)

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
