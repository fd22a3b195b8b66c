"""Router-made trace ids: 128 bits from the OS generator, never handed out twice.

They are read from the OS in batches (one system call per 256 ids), so what must hold is what a
batch could break: threads asking at once, and a forked child reusing its parent's batch.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable

import pytest

from reachmesh.tracecontext import new_span_id, new_trace_id

_HEX32 = re.compile(r"[0-9a-f]{32}")


def test_trace_ids_are_32_hex_digits_and_distinct_across_batches() -> None:
    ids = [new_trace_id() for _ in range(2000)]  # several batches of 256
    assert all(_HEX32.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_threads_asking_at_once_never_share_an_id() -> None:
    got: list[list[str]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def take(out: list[str]) -> None:
        start.wait()
        out.extend(new_trace_id() for _ in range(3000))

    threads = [threading.Thread(target=take, args=(out,)) for out in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for out in got for i in out]
    assert len(set(every)) == len(every) == 12000


def next_ids_in_child_and_parent(new_id: Callable[[], str], count: int) -> tuple[set[str], set[str]]:
    """The next ``count`` ids a forked child hands out, and the parent's next ``count``, after the
    parent took one (so a batch is held, most of it unused)."""
    new_id()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.close(read_end)
            os.write(write_end, "".join(new_id() for _ in range(count)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    parent = "".join(new_id() for _ in range(count))
    width = len(parent) // count
    return (
        {child[i : i + width] for i in range(0, len(child), width)},
        {parent[i : i + width] for i in range(0, len(parent), width)},
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_next_ids() -> None:
    child_ids, parent_ids = next_ids_in_child_and_parent(new_trace_id, 8)
    assert len(child_ids) == 8
    assert not child_ids & parent_ids


def test_span_ids_are_16_hex_digits_never_zero_and_distinct_across_batches() -> None:
    ids = [new_span_id() for _ in range(2000)]  # several batches of 256
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) and i != "0" * 16 for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_next_span_ids() -> None:
    """Span ids come from a seeded generator, 256 at a time: a child that kept the parent's
    batch, or its generator's state, would hand out the parent's next span ids. 300: past one
    batch too, so the child's refill must not be the parent's next batch either."""
    child_ids, parent_ids = next_ids_in_child_and_parent(new_span_id, 300)
    assert len(child_ids) == 300
    assert not child_ids & parent_ids
