"""Capability vectors travel through etcd: a joining Router routes by meaning without embedding."""

from __future__ import annotations

import pytest

from reachmesh.semantic.queue import VectorState
from reachmesh.testing import FakeAgent, RouterServer, wait_vectors
from tests.etcd.conftest import etcd_policy
from tests.etcd.test_shared_registry import eventually

pytestmark = pytest.mark.etcd


async def test_a_joining_router_takes_the_vectors_another_router_embedded(etcd, client):
    """Router B starts after A embedded an agent: B is ready by meaning from etcd, model unused."""
    policy = etcd_policy(
        etcd, embedding={"backend": "local"}, routing={"semantic_tasks": ["*"]}, health={"enabled": False}
    )
    async with RouterServer(policy) as a:
        weather = await FakeAgent(
            "weather",
            tasks=("get_weather_forecast",),
            descriptions={"get_weather_forecast": "查询城市未来几天的天气预报"},
            examples={"get_weather_forecast": ["明天北京会下雨吗", "what's the weather tomorrow in Paris"]},
        ).start()
        price = await FakeAgent(
            "price",
            tasks=("query_product_price",),
            descriptions={"query_product_price": "查询指定商品的当前售价"},
        ).start()
        try:
            await weather.register(a.url)
            await price.register(a.url)
            registry = a.app.parts.registry
            etcd_client, keys = registry.client, registry.keys  # type: ignore[attr-defined]

            async def both_blocks_in_etcd() -> bool:
                _, blocks = await etcd_client.get_prefix(keys.vectors)
                return {kv.key.rsplit("/", 1)[-1] for kv in blocks} == {"weather", "price"}

            # B reads etcd once, at start: A's embeddings must be there by then to be shared.
            await eventually(both_blocks_in_etcd, limit_s=60)
            async with RouterServer(policy) as b:
                vectors = b.app.parts.vectors
                assert vectors is not None
                await wait_vectors(b.url, "weather")
                await wait_vectors(b.url, "price")
                assert vectors.state("weather") is VectorState.READY
                assert vectors.state("price") is VectorState.READY
                assert vectors.shared_hits == 2  # both came from A's embeddings, none from B's model
                routed = (
                    await client.post(f"{b.url}/reach", json={"targetTask": "明天北京会不会下雨"})
                ).json()
                assert routed["status"] == "SUCCESS", routed
                assert routed["handlerAgentId"] == "weather"
        finally:
            await weather.stop()
            await price.stop()
