"""The A2A export's task store is bounded in bytes: each task it keeps holds what an agent
answered, and 30 answers of 4 MB once grew the Router by 165 MiB (5–11 GB at the old cap)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

pytest.importorskip("a2a")

from a2a.types import Artifact, Part, Task, TaskState, TaskStatus

from reachmesh.config import RouterConfig
from reachmesh.integrations.a2a import A2AExport, BoundedTaskStore, owner_context
from reachmesh.testing import FakeAgent, RouterServer, free_port

pytestmark = pytest.mark.integrations

KIB = 1024


def task(text_bytes: int) -> Task:
    return Task(
        id=uuid.uuid4().hex,
        context_id="ctx",
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
        artifacts=[Artifact(artifact_id="a", parts=[Part(text="x" * text_bytes)])],
    )


async def test_the_store_keeps_within_its_bytes_and_cuts_an_oversized_task() -> None:
    store = BoundedTaskStore(1000, max_bytes=100 * KIB, max_task_bytes=40 * KIB)
    alice = owner_context("alice")
    saved = []
    for _ in range(10):
        t = task(30 * KIB)
        await store.save(t, alice)
        saved.append(t.id)
        assert store.bytes_held <= 100 * KIB
    assert await store.get(saved[0], alice) is None  # the oldest went first
    kept = await store.get(saved[-1], alice)
    assert kept is not None and kept.artifacts[0].parts[0].text == "x" * 30 * KIB
    big = task(400 * KIB)
    await store.save(big, alice)
    slim = await store.get(big.id, alice)
    assert slim is not None and not slim.artifacts and store.slimmed == 1
    assert slim.status.state == TaskState.TASK_STATE_COMPLETED
    assert "max_task_bytes" in slim.metadata["agentReachOmitted"]
    assert store.bytes_held <= 100 * KIB
    await store.save(big, alice)  # saving a task again replaces its size, never adds to it
    held = store.bytes_held
    await store.save(big, alice)
    assert store.bytes_held == held


async def test_big_answers_through_the_export_stay_within_the_policy() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = RouterConfig.model_validate(
        {
            "health": {"enabled": False},
            "embedding": {"backend": "none"},
            "limits": {"loop_lag_ms": 10_000},
            "a2a": {"max_store_bytes": 1024 * KIB, "max_task_bytes": 512 * KIB},
        }
    )
    export: list[A2AExport] = []

    def wrap(app: Any) -> A2AExport:
        export.append(A2AExport(app, url))
        return export[0]

    async with RouterServer(config, port=port, middleware=wrap) as router:
        agent = await FakeAgent("big-agent", tasks=("big",), result={"blob": "b" * 300 * KIB}).start()
        try:
            await agent.register(router.url, vectors=False)
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                for i in range(8):
                    call = {
                        "jsonrpc": "2.0",
                        "id": i,
                        "method": "SendMessage",
                        "params": {
                            "message": {
                                "messageId": uuid.uuid4().hex,
                                "role": "ROLE_USER",
                                "parts": [{"data": {"n": i}}],
                                "metadata": {"skill": "big"},
                            }
                        },
                    }
                    answer = await http.post("/a2a/jsonrpc", json=call, headers={"A2A-Version": "1.0"})
                    result = answer.json()["result"]["task"]
                    assert result["status"]["state"] == "TASK_STATE_COMPLETED"
                    assert export[0].tasks.bytes_held <= 1024 * KIB
                metrics = (await http.get("/metrics")).text
            assert f"reach_a2a_task_bytes {float(export[0].tasks.bytes_held)}" in metrics
        finally:
            await agent.stop()


async def test_one_owner_filling_the_store_drops_its_own_tasks_first() -> None:
    """Past a2a.max_tasks (or max_store_bytes) the oldest task of the owner holding the most goes:
    a stranger's thousand SendMessage calls once dropped every other caller's task, each call
    leaving one (a refused skill too), so their GetTask answered task-not-found."""
    store = BoundedTaskStore(10, max_bytes=200 * KIB, max_task_bytes=100 * KIB)
    alice, mallory = owner_context("alice"), owner_context("mallory")
    kept = task(1 * KIB)
    await store.save(kept, alice)
    flood = []
    for _ in range(50):
        t = task(1 * KIB)
        await store.save(t, mallory)
        flood.append(t.id)
    assert await store.get(kept.id, alice) is not None
    assert await store.get(flood[-1], mallory) is not None
    assert await store.get(flood[0], mallory) is None
    for _ in range(10):  # by bytes too
        await store.save(task(60 * KIB), mallory)
        assert store.bytes_held <= 200 * KIB
    assert await store.get(kept.id, alice) is not None
