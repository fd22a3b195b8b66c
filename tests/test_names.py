"""Look-alike names (issue #11): no declared task name or agent id can print like another."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from reachmesh.config import RouterConfig
from reachmesh.names import look_alike_problem
from reachmesh.protocol import AgentProfile, ReachRequest
from reachmesh.testing import FakeAgent, RouterServer
from tests.helpers import price_agent

# (name, the phrase its refusal names, or None when the name is allowed)
NAMES: list[tuple[str, str | None]] = [
    ("pay_task", None),
    ("ｐａｙ＿ｔａｓｋ", "not in NFKC form"),
    ("pаy_task", "mixes the scripts LATIN and CYRILLIC"),
    ("pαy_task", "mixes the scripts LATIN and GREEK"),
    ("pay_task\u0301", "combining mark U+0301"),
    ("pay\u200dtask", "invisible character U+200D"),
    ("pay\u200btask", "invisible character U+200B"),
    ("pay_task\ufe0f", "invisible character U+FE0F"),
    ("pay\u00adtask", "invisible character U+00AD"),
    ("\u202epay_task", "invisible character U+202E"),
    ("pay\u3164task", "invisible character U+3164"),
    ("сору", "all have Latin look-alikes"),
    ("ΤΟΡ", "all have Latin look-alikes"),
    ("查询商品价格", None),
    ("查询_price_v2", None),
    ("價格查詢", None),
    ("価格を調べる", None),
    ("データ_v2", None),
    ("가격_조회", None),
    ("оплата", None),
    ("πληρωμή", None),
    ("मूल्य_जाँच", None),
    ("café", None),
]


def profile(task: str, agent_id: str = "a") -> dict[str, Any]:
    """A minimal registration body declaring one task."""
    return {"id": agent_id, "network": {"endpoint": "http://127.0.0.1:1/r"}, "capabilities": [{"task": task}]}


@pytest.mark.parametrize(("name", "rule"), NAMES)
def test_the_rule_table(name: str, rule: str | None) -> None:
    """Each name is allowed, or refused with the rule it breaks."""
    problem = look_alike_problem(name)
    if rule is None:
        assert problem is None
    else:
        assert problem is not None and rule in problem


@pytest.mark.parametrize(("name", "rule"), NAMES)
def test_profiles_apply_the_rule_to_task_names(name: str, rule: str | None) -> None:
    """AgentProfile accepts the allowed names as written and refuses the rest at capabilities.0.task."""
    if rule is None:
        assert AgentProfile.model_validate(profile(name)).tasks == [name]
        return
    with pytest.raises(ValidationError) as caught:
        AgentProfile.model_validate(profile(name))
    [error] = caught.value.errors()
    assert error["loc"] == ("capabilities", 0, "task")
    assert rule in error["msg"]


def test_full_width_is_refused_not_folded() -> None:
    """A full-width name is refused with its NFKC form named, rather than silently stored as it."""
    with pytest.raises(ValidationError, match="write it as 'pay_task'"):
        AgentProfile.model_validate(profile("ｐａｙ＿ｔａｓｋ"))


def test_agent_ids_are_ascii_only() -> None:
    """Agent ids, targetAgent and filterAgentIds refuse a Cyrillic letter (they are ASCII only)."""
    with pytest.raises(ValidationError):
        AgentProfile.model_validate(profile("pay_task", agent_id="pаy-agent"))
    # targetAgent's pattern once matched any text that merely ended like an id.
    for target in ("pаy-agent", "\x1b[31mpay-agent"):
        with pytest.raises(ValidationError):
            ReachRequest.model_validate({"targetTask": "pay_task", "targetAgent": target})
    assert ReachRequest.model_validate({"targetTask": "t", "targetAgent": ""}).target_agent == ""
    with pytest.raises(ValidationError):
        ReachRequest.model_validate({"targetTask": "t", "preferences": {"filterAgentIds": ["ｐay-agent"]}})


async def test_a_look_alike_cannot_shadow_a_registered_task() -> None:
    """Through a real Router: the impostors get 422 naming the rule; pay_task reaches the real agent."""
    config = RouterConfig.from_mapping({"health": {"enabled": False}, "embedding": {"backend": "none"}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        real = await FakeAgent("pay-agent", tasks=("pay_task",)).start()
        try:
            await real.register(router.url)
            for name, rule in NAMES:
                if rule is None:
                    continue
                resp = await http.post("/agents", json=profile(name, agent_id="impostor"))
                assert resp.status_code == 422, name
                error = resp.json()["error"]
                assert error["code"] == "INVALID_PROFILE"
                [detail] = error["details"]
                assert detail["field"] == "capabilities.0.task"
                assert rule in detail["message"]
            body = (await http.post("/reach", json={"targetTask": "pay_task"})).json()
            assert body["handlerAgentId"] == "pay-agent"
            assert [a["id"] for a in (await http.get("/admin/agents")).json()] == ["pay-agent"]
            impostor_id = {"targetTask": "pay_task", "targetAgent": "pаy-agent"}
            bad_target = await http.post("/reach", json=impostor_id)
            assert bad_target.status_code == 400
            assert bad_target.json()["error"]["code"] == "INVALID_REQUEST"
        finally:
            await real.stop()


async def test_free_text_target_task_still_routes_by_meaning() -> None:
    """A caller's phrase in targetTask is not held to the name rule: Chinese and English reach routing."""
    config = RouterConfig.from_mapping(
        {"health": {"enabled": False}, "routing": {"semantic_tasks": ["*"]}, "embedding": {"backend": "auto"}}
    )
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=30) as http:
        agent = await price_agent().start()
        try:
            await agent.register(router.url)
            for text in ("这个商品现在多少钱", "how much is this"):
                body = (await http.post("/reach", json={"targetTask": text})).json()
                assert body["status"] == "SUCCESS", body
                assert body["handlerAgentId"] == "price-agent"
        finally:
            await agent.stop()


@pytest.mark.parametrize(
    ("agent_id", "rule"),
    [
        ("agent-alpha.", "ends in '.'"),
        ("agent-alpha-", "ends in '-'"),
        ("agent-alpha_", "ends in '_'"),
        ("agent-alpha..", "ends in '.'"),
        ("agent--alpha", "'--' in a row"),
        ("agent.-alpha", "'.-' in a row"),
        ("-agent-alpha", "starts with '-'"),
    ],
)
def test_agent_ids_with_look_alike_punctuation_are_refused(agent_id: str, rule: str) -> None:
    """An id that prints like another by a trailing or doubled separator is refused, saying why."""
    with pytest.raises(ValidationError) as caught:
        AgentProfile.model_validate(profile("pay_task", agent_id=agent_id))
    [error] = caught.value.errors()
    assert error["loc"] == ("id",)
    assert rule in error["msg"]
    with pytest.raises(ValidationError):
        ReachRequest.model_validate({"targetTask": "t", "targetAgent": agent_id})
    for fine in ("agent-alpha", "a", "agent.alpha_2-b", "9" * 128):
        assert AgentProfile.model_validate(profile("pay_task", agent_id=fine)).id == fine
    with pytest.raises(ValidationError):
        AgentProfile.model_validate(profile("pay_task", agent_id="9" * 129))


@pytest.mark.parametrize("task", ["pay_task.", "pay_task-", "pay_task:", "pay_task_"])
def test_task_names_ending_in_a_separator_are_refused(task: str) -> None:
    """``pay_task.`` prints like ``pay_task``: refused, naming the name it passes for."""
    with pytest.raises(ValidationError, match="prints like 'pay_task'"):
        AgentProfile.model_validate(profile(task))


async def test_a_trailing_dot_cannot_register_beside_the_real_agent() -> None:
    """Through a real Router: ``pay-agent.`` gets 422 at ``id`` and the real agent keeps serving."""
    config = RouterConfig.from_mapping({"health": {"enabled": False}, "embedding": {"backend": "none"}})
    async with RouterServer(config) as router, httpx.AsyncClient(base_url=router.url, timeout=10) as http:
        real = await FakeAgent("pay-agent", tasks=("pay_task",)).start()
        try:
            await real.register(router.url)
            resp = await http.post("/agents", json=profile("pay_task", agent_id="pay-agent."))
            assert resp.status_code == 422
            [detail] = resp.json()["error"]["details"]
            assert detail["field"] == "id" and "prints like 'pay-agent'" in detail["message"]
            assert [a["id"] for a in (await http.get("/admin/agents")).json()] == ["pay-agent"]
            body = (await http.post("/reach", json={"targetTask": "pay_task"})).json()
            assert body["handlerAgentId"] == "pay-agent"
        finally:
            await real.stop()
