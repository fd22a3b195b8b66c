"""Router processes over etcd: a kill -9 and restart, workers on one port, a 3-member cluster."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reachmesh.cli.etcd import EtcdCluster
from reachmesh.testing import free_port
from tests.helpers import scaled
from tests.procs import Proc, chaos_agent, wait_for

pytestmark = pytest.mark.etcd


class EtcdRouters:
    """Router processes sharing one etcd, and SDK agents (the chaos example) registered with them."""

    def __init__(self, tmp: Path, cluster: EtcdCluster, policy: dict[str, Any] | None = None) -> None:
        self.tmp = tmp
        self.cluster = cluster
        # A restart must fit in a lease, and a Router start takes seconds on a busy machine.
        ttl = scaled(3)
        base: dict[str, Any] = {"registry": {"lease_ttl_seconds": ttl}, "embedding": {"backend": "none"}}
        for key, value in (policy or {}).items():
            base[key] = {**base.get(key, {}), **value}
        self.config = tmp / "router.yaml"
        self.config.write_text(yaml.safe_dump(base))
        self.env = {"REACH_ETCD_ENDPOINTS": cluster.endpoints}
        self.procs: list[Proc] = []
        self.http = httpx.Client(timeout=15)

    def router(self, port: int, *extra: str, log: str = "router") -> Proc:
        proc = Proc(
            ["router", "--port", str(port), "--config", str(self.config), *extra],
            self.tmp / f"{log}.log",
            self.env,
        )
        self.procs.append(proc)
        wait_for(lambda: self.http.get(f"http://127.0.0.1:{port}/readyz").status_code == 200, timeout=30)
        return proc

    def agent(self, name: str, router_url: str) -> Proc:
        (self.tmp / f"{name}.faults.json").write_text("{}")
        proc = chaos_agent(self.tmp, name, router_url, free_port(), free_port())
        self.procs.append(proc)
        wait_for(lambda: "registration successful" in proc.text(), timeout=30)
        return proc

    def call(self, url: str) -> str:
        return str(self.http.post(f"{url}/reach", json={"targetTask": "chaos"}).json()["status"])

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.http.close()


@pytest.fixture
def routers(tmp_path: Path, etcd: EtcdCluster):
    """Router and agent processes over the test's etcd, all stopped at the end."""
    group = EtcdRouters(tmp_path, etcd)
    yield group
    group.stop()


def test_a_router_killed_with_9_routes_at_once_after_restart_and_no_agent_registers_again(routers):
    """kill -9, start again: it routes from etcd at once; agents keep their leases."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router = routers.router(port)
    agent = routers.agent("steady", url)
    assert routers.call(url) == "SUCCESS"
    router.signal(signal.SIGKILL)
    router.popen.wait()
    restarted_at = time.monotonic()
    routers.router(port, log="router-again")
    print(f"ready {time.monotonic() - restarted_at:.2f} s after the restart began")
    assert routers.call(url) == "SUCCESS"
    # Three renewals (one every third of the TTL) land on the new process, on the same lease.
    heartbeats: set[str] = set()

    def renewed_three_times() -> bool:
        heartbeats.add(routers.http.get(f"{url}/admin/agents/steady").json()["lastHeartbeat"])
        return len(heartbeats) >= 4

    wait_for(renewed_three_times, interval=0.2, what="three renewals seen by the restarted Router")
    assert routers.call(url) == "SUCCESS"
    assert agent.text().count("registering agent") == 1
    assert "registering again" not in agent.text()


def test_workers_share_the_port_and_one_registry(routers):
    """`reach router --workers 2`: both workers answer on one port and both know every agent."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    supervisor = routers.router(port, "--workers", "2", log="workers")
    routers.agent("steady", url)
    knowing: set[int] = set()

    def both_workers_list_it() -> bool:
        # A new connection each time: the kernel spreads them over the workers. The worker that
        # took the registration lists it at once; the other once its watch brings it.
        with httpx.Client(timeout=10) as fresh:
            worker = fresh.get(f"{url}/healthz").json()["worker"]
            ids = [row["id"] for row in fresh.get(f"{url}/admin/agents").json()]
        assert ids in ([], ["steady"]), ids
        if ids:
            knowing.add(worker)
        return knowing == {0, 1}

    wait_for(both_workers_list_it, interval=0.01, what="both workers listing the agent")
    for _ in range(20):
        with httpx.Client(timeout=10) as fresh:
            assert fresh.post(f"{url}/reach", json={"targetTask": "chaos"}).json()["status"] == "SUCCESS"
    supervisor.signal(signal.SIGTERM)
    assert supervisor.popen.wait(15) == 0


def test_workers_without_etcd_are_refused(tmp_path):
    """--workers 2 with the in-memory registry is a one-line error, not N private registries."""
    proc = Proc(
        ["router", "--port", str(free_port()), "--workers", "2"],
        tmp_path / "r.log",
        {"REACH_ETCD_ENDPOINTS": ""},
    )
    assert proc.popen.wait(30) != 0
    assert "--workers 2 needs the etcd registry" in proc.text()
    assert "Traceback" not in proc.text()
    proc.stop()


@pytest.fixture
def cluster3(tmp_path: Path):
    """A 3-member etcd cluster on loopback."""
    with EtcdCluster(tmp_path / "etcd3", 3) as cluster:
        yield cluster


def register_until_done(
    http: httpx.Client, url: str, agent_id: str, limit_s: float = 30
) -> tuple[int, float]:
    """Register as the SDK does (retrying a 503 with backoff); returns (503s seen, seconds taken)."""
    body = {
        "id": agent_id,
        "network": {"endpoint": "http://127.0.0.1:9/reach"},
        "capabilities": [{"task": agent_id}],
    }
    started = time.monotonic()
    refusals = 0
    delay = 0.1
    while time.monotonic() - started < limit_s:
        resp = http.post(f"{url}/agents", json=body)
        if resp.status_code == 201:
            return refusals, time.monotonic() - started
        assert resp.status_code == 503, resp.text
        refusals += 1
        time.sleep(delay)
        delay = min(delay * 2, 2)
    raise AssertionError(f"{agent_id} not registered in {limit_s} s")


def test_a_three_member_cluster_loses_a_follower_then_its_leader_under_traffic(tmp_path, cluster3):
    """Kill a follower, then the leader: registrations go through, no request fails, none is lost."""
    group = EtcdRouters(tmp_path, cluster3, {"registry": {"lease_ttl_seconds": 10}})
    try:
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for i, port in enumerate(ports):
            group.router(port, log=f"router{i}")
        group.agent("steady", urls[0])
        for url in urls:  # the second Router knows the agent once its watch brings it

            def steady_listed(url: str = url) -> bool:
                return "steady" in {row["id"] for row in group.http.get(f"{url}/admin/agents").json()}

            wait_for(steady_listed, timeout=15)
        outcomes: Counter[str] = Counter()
        stop = threading.Event()

        def traffic() -> None:
            with httpx.Client(timeout=15) as http:
                n = 0
                while not stop.is_set():
                    url = urls[n % 2]
                    n += 1
                    outcomes[http.post(f"{url}/reach", json={"targetTask": "chaos"}).json()["status"]] += 1
                    time.sleep(0.01)

        thread = threading.Thread(target=traffic)
        thread.start()
        try:
            leader = wait_for(cluster3.leader, timeout=20)
            follower = next(m for m in cluster3.members if m is not leader)
            follower.kill()
            refused, took = register_until_done(group.http, urls[1], "after-follower")
            print(f"follower down: registered in {took:.2f} s after {refused} 503s")
            cluster3.restart(follower)
            leader = wait_for(cluster3.leader, timeout=20)
            leader.kill()
            refused, took = register_until_done(group.http, urls[0], "after-leader")
            print(f"leader down: registered in {took:.2f} s after {refused} 503s")
            for url in urls:

                def both_listed(url: str = url) -> bool:
                    ids = {row["id"] for row in group.http.get(f"{url}/admin/agents").json()}
                    return {"after-follower", "after-leader"} <= ids

                wait_for(both_listed, timeout=15)
        finally:
            stop.set()
            thread.join()
        print(f"traffic through both cuts: {dict(outcomes)}")
        assert outcomes["SUCCESS"] > 0
        assert set(outcomes) == {"SUCCESS"}
    finally:
        group.stop()


def test_workers_on_a_taken_port_stop_with_one_line(tmp_path, etcd):
    """--workers 2 on a port another process holds: a one-line error and an exit, no restart loop."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = Proc(
            ["router", "--port", str(port), "--workers", "2"],
            tmp_path / "taken.log",
            {"REACH_ETCD_ENDPOINTS": etcd.endpoints},
        )
        assert proc.popen.wait(60) != 0
        text = proc.text()
        proc.stop()
    assert "cannot bind" in text and "a worker cannot start" in text
    assert "Traceback" not in text
    assert text.count("restarting") <= 2


def test_workers_leave_with_their_supervisor_even_on_kill_9(routers):
    """kill -9 of the supervisor: its workers get SIGTERM from the kernel and free the port."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    supervisor = routers.router(port, "--workers", "2", log="orphans")
    supervisor.signal(signal.SIGKILL)
    supervisor.popen.wait()

    def port_closed() -> bool:
        try:
            httpx.get(f"{url}/healthz", timeout=0.5)
        except httpx.HTTPError:
            return True
        return False

    wait_for(port_closed, timeout=20)


def test_a_second_workers_group_on_the_same_port_is_refused(routers, tmp_path):
    """Two `reach router --workers 2` on one port: SO_REUSEPORT would split callers between
    them silently; the second stops with a line naming the first, which keeps serving."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = routers.router(port, "--workers", "2", log="first")
    second = Proc(
        ["router", "--port", str(port), "--config", str(routers.config), "--workers", "2"],
        tmp_path / "second.log",
        routers.env,
    )
    assert second.popen.wait(30) != 0
    text = second.text()
    second.stop()
    holder = f"(pid {first.popen.pid})"
    assert f"port {port} is already served by another `reach router --workers` {holder}" in text
    assert "Traceback" not in text
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
