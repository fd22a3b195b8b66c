"""What a payload full of input_schema faults costs the Router: the refusal and the stall it causes.

One Router with an agent whose schema wants an array of strings; a body of ``--items`` integers
(340,000 is just under 1 MB) is sent while a second client probes ``/healthz`` back to back. The
figures: how long the refusal took, its size and ``details`` count, and the longest ``/healthz``
answer meanwhile (the event loop's stall, as any other caller sees it).

    .venv/bin/python bench/error_details.py
    .venv/bin/python bench/error_details.py --compare-src /tmp/reach-head/src   # an older tree too
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}}


async def measure(items: int) -> dict[str, float]:
    import httpx
    import orjson

    from reachmesh.config import RouterConfig
    from reachmesh.testing import FakeAgent, RouterServer

    config = RouterConfig.model_validate(
        {"embedding": {"backend": "none"}, "health": {"enabled": False}, "limits": {"loop_lag_ms": 60_000}}
    )
    body = orjson.dumps({"targetTask": "strict", "payload": {"items": [1] * items}})
    async with RouterServer(config) as router:
        agent = await FakeAgent("strict", tasks=("strict",), input_schema=SCHEMA).start()
        try:
            await agent.register(router.url, vectors=False)
            async with (
                httpx.AsyncClient(base_url=router.url, timeout=120) as http,
                httpx.AsyncClient(base_url=router.url, timeout=120) as probe,
            ):
                await probe.get("/healthz")
                started = time.perf_counter()
                call = asyncio.create_task(
                    http.post("/reach", content=body, headers={"Content-Type": "application/json"})
                )
                worst = 0.0
                while not call.done():
                    sent = time.perf_counter()
                    await probe.get("/healthz")
                    worst = max(worst, time.perf_counter() - sent)
                resp = await call
                took = time.perf_counter() - started
            error = resp.json()["error"]
            return {
                "body bytes": float(len(body)),
                "refusal s": took,
                "answer bytes": float(len(resp.content)),
                "details": float(len(error.get("details") or [])),
                "worst /healthz s": worst,
            }
        finally:
            await agent.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=340_000, help="wrong items in the payload")
    parser.add_argument("--compare-src", help="a src/ folder of another version, measured the same way")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args()
    figures = asyncio.run(measure(args.items))
    if args.json:
        print(json.dumps(figures))
        return
    columns = {"this tree": figures}
    if args.compare_src:
        env = {**os.environ, "PYTHONPATH": args.compare_src}
        child = [sys.executable, __file__, "--json", "--items", str(args.items)]
        out = subprocess.run(child, env=env, check=True, capture_output=True, text=True).stdout
        columns = {args.compare_src: json.loads(out.strip().splitlines()[-1]), **columns}
    print(f"a payload of {args.items:,} input_schema faults")
    print("figure".ljust(18) + "".join(name[-24:].rjust(26) for name in columns))
    for name in figures:
        print(name.ljust(18) + "".join(f"{col.get(name, float('nan')):26.3f}" for col in columns.values()))


if __name__ == "__main__":
    main()
