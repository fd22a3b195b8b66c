"""An agent's life through a Router outage and its own crash, with real processes on loopback.

    .venv/bin/python bench/agent_outage.py [outage] [restart] [--down SECONDS]

- outage: the Router is stopped for 60 s (``--down``) under a registered SDK agent (the default
  60 s lease), then started again on the same port. Figures: the lines the agent logged from
  the stop until it was registered again (target: < 15) and how long after the Router answered
  again the agent was listed (target: <= 10 s).
- restart: ``kill -9`` the agent and start it again at once, same id and endpoint. Figure: from
  the new process's start until the Router routes a request to it (target: <= 5 s, process
  start included).

tests/sdk/test_lease_backoff.py asserts the outage behaviour on an injected clock and
tests/sdk/test_lifecycle.py the takeover; this script prints the wall-clock figures. Exits 1
when one misses its target. The outage takes about --down + 20 s.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.procs, run from anywhere

from tests.procs import Proc, chaos_agent, wait_for

from reachmesh.testing import free_port

MISSED: list[str] = []


def report(name: str, figure: str, ok: bool) -> None:
    print(f"{name:>8}: {figure}  [{'ok' if ok else 'MISSED'}]", flush=True)
    if not ok:
        MISSED.append(name)


def start_router(tmp: Path, port: int, log: str) -> Proc:
    config = tmp / "router.yaml"
    config.write_text(yaml.safe_dump({"embedding": {"backend": "none"}}))
    router = Proc(["router", "--port", str(port), "--config", str(config)], tmp / f"{log}.log")
    wait_for(lambda: "listening on" in router.text(), timeout=60)
    return router


def listed(url: str, agent_id: str) -> bool:
    import httpx

    resp = httpx.get(f"{url}/admin/agents/{agent_id}", timeout=2)
    return resp.status_code == 200 and resp.json()["status"] == "available"


def outage(down_s: float) -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        router = start_router(tmp, port, "router")
        agent = chaos_agent(tmp, "patient", url, free_port(), free_port())
        (tmp / "patient.faults.json").write_text("{}")
        try:
            wait_for(lambda: "registration successful" in agent.text(), timeout=60)
            before = len(agent.text().splitlines())
            router.signal(signal.SIGTERM)
            router.popen.wait(30)
            router.stop()
            time.sleep(down_s)  # the outage itself: a wall-clock figure is what this script is for
            router = start_router(tmp, port, "router-again")
            back = time.monotonic()
            wait_for(lambda: listed(url, "patient"), timeout=120, interval=0.1)
            took = time.monotonic() - back
            wait_for(lambda: agent.text().count("registration successful") >= 2, timeout=30)
            lines = agent.text().splitlines()[before:]
            report("outage", f"{len(lines)} agent lines over a {down_s:.0f} s outage (< 15)", len(lines) < 15)
            report("return", f"listed again {took:.1f} s after the Router was back (<= 10 s)", took <= 10)
            print("\n".join(f"          | {line}" for line in lines))
        finally:
            agent.stop()
            router.stop()


def restart() -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        router = start_router(tmp, port, "router")
        ports = (free_port(), free_port())
        (tmp / "phoenix.faults.json").write_text("{}")
        first = chaos_agent(tmp, "phoenix", url, *ports)
        second: Proc | None = None
        try:
            wait_for(lambda: "registration successful" in first.text(), timeout=60)
            first.signal(signal.SIGKILL)
            first.popen.wait(10)
            before = first.text().count("registration successful")
            started = time.monotonic()
            second = chaos_agent(tmp, "phoenix", url, *ports)

            def routed() -> bool:
                import httpx

                if second is None or second.text().count("registration successful") <= before:
                    return False
                body = {"targetAgent": "phoenix", "targetTask": "chaos", "payload": {}}
                return bool(httpx.post(f"{url}/reach", json=body, timeout=5).json()["status"] == "SUCCESS")

            wait_for(routed, timeout=90, interval=0.05)
            took = time.monotonic() - started
            report("restart", f"kill -9, start again: routed to in {took:.2f} s (<= 5 s)", took <= 5)
        finally:
            first.stop()
            if second is not None:
                second.stop()
            router.stop()


def main() -> None:
    args = sys.argv[1:]
    down = 60.0
    if "--down" in args:
        at = args.index("--down")
        down = float(args[at + 1])
        del args[at : at + 2]
    chosen = args or ["outage", "restart"]
    if "outage" in chosen:
        outage(down)
    if "restart" in chosen:
        restart()
    sys.exit(1 if MISSED else 0)


if __name__ == "__main__":
    main()
