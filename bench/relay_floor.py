"""What relaying a large stream costs the kernel alone, without a Router: the floor under the
Router's CPU per MiB in bench/streaming.py (issue #35).

The streaming agent (bench/stream_agent.py) answers ``--mib`` MiB of 64 KiB chunk events; a
relay in this process passes its bytes, untouched and unparsed, to a reader on another
loopback connection, with blocking sockets and no event loop, in one of three ways:

- ``copy``: ``recv_into`` a 512 KiB buffer, then ``sendall`` (what any user-space relay does,
  the Router included, before it parses or checks anything);
- ``splice``: socket to pipe to socket with ``os.splice``, the bytes never in user space;
- ``peek``: ``splice`` after a ``recv_into`` with ``MSG_PEEK`` of what is there, the copy a
  relay that checks each chunk's JSON would still need.

Printed per mode: the relay thread's user and system CPU seconds, medians of ``--repeat``
streams. Linux only (splice, RUSAGE_THREAD).

    .venv/bin/python bench/relay_floor.py [--mib 100] [--repeat 5]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from servers import Server, free_port, http

BENCH_DIR = Path(__file__).resolve().parent
CHUNK = 64 * 1024
_F_SETPIPE_SZ = 1031


def answer_bytes(chunks: int) -> int:
    """The bytes of stream_agent.py's answer of ``chunks`` chunks (head, chunked framing)."""
    piece = json.dumps("x" * CHUNK).encode()
    total = len(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    for n in range(chunks):
        size = len(b"event: chunk\ndata: [%d,%s]\n\n" % (n, piece))
        total += len(b"%x\r\n" % size) + size + 2
    done = len(b'event: done\ndata: {"status":"SUCCESS"}\n\n')
    return total + len(b"%x\r\n" % done) + done + 2 + 5


def relay(mode: str, agent_port: int, chunks: int, expected: int, out: socket.socket) -> tuple[float, float]:
    """One stream from the agent to ``out``; the relay's (user, system) CPU seconds."""
    body = json.dumps({"payload": {"chunks": chunks, "size": CHUNK}}).encode()
    with socket.create_connection(("127.0.0.1", agent_port)) as agent:
        agent.sendall(b"POST /reach HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        before = resource.getrusage(resource.RUSAGE_THREAD)
        moved = 0
        if mode == "copy":
            buffer = memoryview(bytearray(512 * 1024))
            while moved < expected:
                n = agent.recv_into(buffer)
                out.sendall(buffer[:n])
                moved += n
        else:
            read_end, write_end = os.pipe()
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, 1 << 20)
            peek = bytearray(1 << 20)
            try:
                while moved < expected:
                    if mode == "peek":
                        agent.recv_into(peek, len(peek), socket.MSG_PEEK)
                    n = os.splice(agent.fileno(), write_end, 1 << 20)
                    moved += n
                    while n:
                        n -= os.splice(read_end, out.fileno(), n)
            finally:
                os.close(read_end)
                os.close(write_end)
        after = resource.getrusage(resource.RUSAGE_THREAD)
    return after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def measure(mode: str, agent_port: int, args: argparse.Namespace) -> dict[str, float]:
    chunks = args.mib * 1024 * 1024 // CHUNK
    expected = answer_bytes(chunks)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        reader = socket.create_connection(listener.getsockname())
        sender, _ = listener.accept()
        with reader, sender:

            def read() -> None:
                buffer = memoryview(bytearray(1 << 20))
                got = 0
                while got < expected:
                    got += reader.recv_into(buffer)

            runs = []
            for _ in range(args.repeat):
                thread = threading.Thread(target=read)
                thread.start()
                runs.append(relay(mode, agent_port, chunks, expected, sender))
                thread.join()
    return {
        f"{mode}_user_seconds": round(statistics.median(r[0] for r in runs), 4),
        f"{mode}_sys_seconds": round(statistics.median(r[1] for r in runs), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="reach-relay-floor-"))
    port = free_port()
    agent = Server(
        "agent", [sys.executable, str(BENCH_DIR / "stream_agent.py"), str(port)], workdir / "agent.log"
    )
    agent.start()
    try:
        agent.wait_ready(lambda: http("GET", f"http://127.0.0.1:{port}/healthz")[0] == 200)
        results: dict[str, float] = {"mib": args.mib}
        for mode in ("copy", "splice", "peek"):
            results.update(measure(mode, port, args))
        print(json.dumps(results, indent=2))
    finally:
        agent.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
