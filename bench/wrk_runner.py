"""Run wrk with a fixed POST body and read its report."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
_LATENCY_LINE = re.compile(r"^\s*(50|75|90|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m)\s*$", re.M)
_REQUESTS = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m)", re.M)
_RPS = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_STATUS = re.compile(r"^status (\d+): (\d+)$", re.M)

# wrk only counts "non-2xx"; these hooks tell which statuses they were (a 429 from load
# shedding and a 502 from a broken forward call for different fixes). The counting is a table
# increment per non-200 answer, too cheap to show in the figures.
_STATUS_HOOKS = """
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {} end
function response(status, headers, body)
  if status ~= 200 then statuses[status] = (statuses[status] or 0) + 1 end
end
function done(summary, latency, requests)
  for _, t in ipairs(threads) do
    for code, n in pairs(t:get("statuses")) do io.write(string.format("status %d: %d\\n", code, n)) end
  end
end
"""


@dataclass
class WrkResult:
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p75_ms: float
    p90_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: int
    statuses: dict[int, int] = field(default_factory=dict)  # non-200 answers by HTTP status

    @property
    def errors(self) -> int:
        return self.non_2xx + self.socket_errors

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_post_script(path: Path, body: Any, headers: dict[str, str] | None = None) -> Path:
    """The Lua that makes wrk send ``body`` as a JSON POST (wrk only GETs without one) and
    report the status of every non-200 answer."""
    # json.dumps output is a valid Lua string literal once wrapped in a long bracket.
    path.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = [==[{json.dumps(body, separators=(',', ':'))}]==]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        + "".join(f'wrk.headers["{name}"] = "{value}"\n' for name, value in (headers or {}).items())
        + _STATUS_HOOKS
    )
    return path


def parse(output: str) -> WrkResult:
    latencies = {int(q): float(v) * _UNITS[u] for q, v, u in _LATENCY_LINE.findall(output)}
    done = _REQUESTS.search(output)
    rps = _RPS.search(output)
    if done is None or rps is None or set(latencies) != {50, 75, 90, 99}:
        raise ValueError(f"cannot read wrk's report:\n{output}")
    non_2xx = _NON_2XX.search(output)
    sock = _SOCKET_ERRORS.search(output)
    return WrkResult(
        requests=int(done.group(1)),
        seconds=float(done.group(2)) * _UNITS[done.group(3)] / 1e3,
        rps=float(rps.group(1)),
        p50_ms=latencies[50],
        p75_ms=latencies[75],
        p90_ms=latencies[90],
        p99_ms=latencies[99],
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        socket_errors=sum(int(n) for n in sock.groups()) if sock else 0,
        statuses={int(code): int(n) for code, n in _STATUS.findall(output)},
    )


def run(
    url: str,
    script: Path,
    *,
    connections: int,
    threads: int,
    duration_s: float,
    core: int | None,
    timeout_s: float = 5.0,
) -> WrkResult:
    """One wrk run; raises if wrk fails or nothing came back. Failed requests are counted, not
    raised: a forwarder that sheds load under stress is a finding to report."""
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        f"--timeout={timeout_s:g}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    if core is not None:
        argv = ["taskset", "-c", str(core), *argv]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=duration_s + 60)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    result = parse(done.stdout)
    if result.requests == 0 or result.non_2xx >= result.requests:
        raise RuntimeError(f"{url}: no request succeeded:\n{done.stdout}")
    return result
