"""CPU per agent answer: the Router's reader (httptools/llhttp) against h11, the pure-Python one.

Both read the same typical agent answers (a 200 with a small JSON body, and one behind a
``100 Continue``) with the same bounds on the head, from bytes, with no sockets: what differs is
only the parser. The figure to hold it against is the Router's CPU per request in
bench/router_overhead.py: a parser that costs more than 5 % of that per answer is not "within 5 %".

Run::

    .venv/bin/python bench/answer_parsers.py [--answers 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import h11

from reachmesh.transport.answer import AnswerReader, HeadLimits

BODY = b'{"status":"SUCCESS","result":{"echo":{"n":1},"agent":"bench-agent"}}'
PLAIN = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
    b"Content-Length: %d\r\nDate: Tue, 01 Dec 2026 22:00:00 GMT\r\nServer: Python/3.11 aiohttp/3.9\r\n\r\n%s"
    % (len(BODY), BODY)
)
INTERIM = b"HTTP/1.1 100 Continue\r\n\r\n" + PLAIN
LIMITS = HeadLimits()
LIMIT = 8 * 1024 * 1024


def with_httptools(data: bytes, n: int) -> None:
    reader = AnswerReader(LIMITS)
    for _ in range(n):
        reader.start(LIMIT)
        if not reader.feed(data):
            raise AssertionError("incomplete")
        answer = reader.answer()
        if answer.status != 200 or not reader.reusable:
            raise AssertionError(answer)


def with_h11(data: bytes, n: int) -> None:
    request = h11.Request(method="POST", target="/reach", headers=[("Host", "a"), ("Content-Length", "2")])
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=LIMITS.max_bytes)
    for _ in range(n):
        conn.send(request)
        conn.send(h11.Data(data=b"{}"))
        conn.send(h11.EndOfMessage())
        conn.receive_data(data)
        status = 0
        chunks: list[bytes] = []
        headers = 0
        while True:
            event = conn.next_event()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = len(event.headers)
                if headers > LIMITS.max_headers:
                    raise AssertionError("too many headers")
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise AssertionError(event)
        if status != 200 or b"".join(chunks) != BODY:
            raise AssertionError(status)
        conn.start_next_cycle()


def per_answer_us(parse: Callable[[bytes, int], None], data: bytes, n: int, rounds: int) -> list[float]:
    figures = []
    for _ in range(rounds):
        began = time.process_time()
        parse(data, n)
        figures.append((time.process_time() - began) / n * 1e6)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--answers", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"CPU µs per answer, {args.answers:,} answers per round, {args.rounds} rounds interleaved")
    print(f"{'answer':10} {'parser':10} {'median':>8} {'min':>8} {'max':>8}")
    for name, data in (("200", PLAIN), ("100+200", INTERIM)):
        results: dict[str, list[float]] = {"httptools": [], "h11": []}
        for _ in range(args.rounds):
            # Interleaved, one round each in turn, so a busy machine disturbs both alike.
            results["httptools"] += per_answer_us(with_httptools, data, args.answers, 1)
            results["h11"] += per_answer_us(with_h11, data, args.answers, 1)
        for label, figures in results.items():
            middle, low, high = statistics.median(figures), min(figures), max(figures)
            print(f"{name:10} {label:10} {middle:8.2f} {low:8.2f} {high:8.2f}")


if __name__ == "__main__":
    main()
