"""The Streaming page's copy-paste example, run as the page gives it: its reach_config.yaml,
story_agent.py and story_caller.py blocks are written to a folder and run as processes (only the
Router's URL and the agent's port are changed to free ones), and the caller must print the story
as it comes, not at its end."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import httpx
import pytest

from reachmesh.config import RouterConfig
from reachmesh.testing import RouterServer, free_port
from tests.helpers import scaled, until

pytestmark = pytest.mark.e2e

PAGE = Path(__file__).resolve().parents[1] / "docs" / "streaming.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
ROUTER = "http://127.0.0.1:7200"
LAST_WORD = "time."


def blocks() -> dict[str, str]:
    """The page's code blocks that name their file on their first line (``# name``)."""
    found = {}
    for _, code in FENCE.findall(PAGE.read_text(encoding="utf-8")):
        first = code.split("\n", 1)[0]
        if first.startswith("# ") and first[2:].strip().endswith((".py", ".yaml")):
            found[first[2:].strip()] = code
    return found


def test_the_page_names_its_three_files() -> None:
    assert {"reach_config.yaml", "story_agent.py", "story_caller.py"} <= set(blocks())


async def test_the_copy_paste_example_streams_the_story_as_it_comes(tmp_path: Path) -> None:
    code = blocks()
    config = RouterConfig.model_validate({"health": {"enabled": False}, "embedding": {"backend": "none"}})
    async with RouterServer(config) as router:
        agent_port = free_port()
        for name, text in code.items():
            text = text.replace(ROUTER, router.url).replace("127.0.0.1:7431", f"127.0.0.1:{agent_port}")
            (tmp_path / name).write_text(text, encoding="utf-8")
        agent = await asyncio.create_subprocess_exec(
            sys.executable, "story_agent.py", cwd=tmp_path, stdout=asyncio.subprocess.DEVNULL
        )
        try:
            async with httpx.AsyncClient() as http:

                async def registered() -> bool:
                    assert agent.returncode is None, "the example agent stopped"
                    rows = (await http.get(f"{router.url}/admin/agents")).json()
                    return any(row["id"] == "story-agent" for row in rows)

                await until(registered, "the example agent registered", within=30)
            caller = await asyncio.create_subprocess_exec(
                sys.executable, "-u", "story_caller.py", cwd=tmp_path, stdout=asyncio.subprocess.PIPE
            )
            assert caller.stdout is not None
            async with asyncio.timeout(scaled(30)):
                first = await caller.stdout.read(4096)
                rest = await caller.stdout.read()
                assert await caller.wait() == 0
        finally:
            agent.terminate()
            await agent.wait()
    printed = (first + rest).decode()
    assert printed.startswith("Once upon a time there was a story about mangoes"), printed
    assert f"{LAST_WORD} \nSUCCESS story-agent" in printed, printed
    # The first words were printed while the agent was still generating (a word each 0.2 s):
    # a caller that waited for the whole answer would print it in one go, last word included.
    assert first.startswith(b"Once ") and LAST_WORD.encode() not in first, first
