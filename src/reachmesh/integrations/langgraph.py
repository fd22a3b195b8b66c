"""LangGraph through the Router (langgraph 1.x; the ``langgraph`` extra).

- :func:`reach_node` builds a graph node that sends part of the state as a ReachRequest and
  writes the answer back. The Router's structured failures (``NO_AVAILABLE_HANDLER``,
  ``TIMEOUT``, ``CONTEXT_UNAVAILABLE``, and every other non-success status) become state under
  ``status_key``/``error_key`` for a conditional edge to branch on, not exceptions. Only "no
  answer at all" (:class:`~reachmesh.exceptions.RouterUnavailable`) raises.
- The request's ``conversationId`` is the LangGraph thread id (``configurable.thread_id``), so
  affinity and ``contextBound`` follow the graph's own conversation.
- :func:`graph_agent` serves a compiled graph as a Reach agent (one capability) in one call;
  :func:`serve_graph` also runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from reachmesh.integrations import LoopClients, missing_extra, single_capability_agent
from reachmesh.protocol import ReachResponse, Status
from reachmesh.sdk import ReachAgent, ReachClient, ReachContext

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.config import get_stream_writer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra("langgraph", exc) from exc

State = Mapping[str, Any]
Inputs = Sequence[str] | Mapping[str, str] | Callable[[State], dict[str, Any]] | None


class ReachNode(Protocol):
    """A graph node: the graph's own state (a TypedDict, a dataclass, a model) and the run's
    config in, a partial state update out."""

    async def __call__(self, state: Any, config: RunnableConfig) -> dict[str, Any]: ...


# The statuses a graph usually branches on; every non-success status is state all the same.
STRUCTURED_FAILURES = frozenset({Status.NO_AVAILABLE_HANDLER, Status.TIMEOUT, Status.CONTEXT_UNAVAILABLE})


def payload_from(state: State, inputs: Inputs) -> dict[str, Any]:
    """The payload for ``state``: listed keys, renamed keys (state key → payload key), a
    function of the state, or (``None``) every key of the state."""
    if inputs is None:
        return dict(state)
    if callable(inputs):
        return inputs(state)
    if isinstance(inputs, Mapping):
        return {
            payload_key: state[state_key] for state_key, payload_key in inputs.items() if state_key in state
        }
    return {key: state[key] for key in inputs if key in state}


def thread_id(config: RunnableConfig | None) -> str | None:
    """The LangGraph thread id of a run, if it has one."""
    configurable = (config or {}).get("configurable") or {}
    value = configurable.get("thread_id")
    return None if value is None else str(value)


def reach_node(  # noqa: PLR0913 - each keyword is one choice a graph author makes
    task: str,
    *,
    inputs: Inputs = None,
    output: str = "result",
    status_key: str = "reach_status",
    error_key: str = "reach_error",
    response_key: str | None = None,
    client: ReachClient | None = None,
    router_url: str | None = None,
    source_agent: str = "langgraph",
    stream: bool = False,
    **options: Any,
) -> ReachNode:
    """A graph node that calls ``task`` through the Router.

    The node returns ``{output: result, status_key: "SUCCESS", error_key: None}`` on success and
    ``{output: None, status_key: <status>, error_key: <error object>}`` otherwise, so the graph
    branches with ``add_conditional_edges(node, lambda s: s["reach_status"], {...})``.
    ``response_key`` also stores the trace id, handler and attempts (to see a failover).
    ``options`` are :meth:`ReachClient.call`'s (``timeout_ms``, ``strategy``, ...).

    With ``stream=True`` the call is streamed (protocol §14): each chunk is written to the
    graph's custom stream as ``{"task": task, "chunk": value}`` as it arrives, so
    ``graph.astream(..., stream_mode="custom")`` yields the agent's chunks while it talks; the
    node's ``output`` is then the agent's final result, or the list of its chunks when it gave
    none.
    """
    own = LoopClients(router_url, source_agent)

    async def node(state: Any, config: RunnableConfig) -> dict[str, Any]:
        call_options = dict(options)
        conversation = thread_id(config)
        if conversation is not None:
            call_options.setdefault("conversation_id", conversation)
        caller = client if client is not None else await own.get()
        if stream:
            reply, chunks = await _streamed(caller, task, payload_from(state, inputs), call_options)
            result = reply.result if reply.result is not None or not reply.ok else chunks
        else:
            reply = await caller.call(task, payload_from(state, inputs), **call_options)
            result = reply.result
        update: dict[str, Any] = {
            output: result if reply.ok else None,
            status_key: str(reply.status),
            error_key: None
            if reply.error is None
            else reply.error.model_dump(by_alias=True, exclude_none=True),
        }
        if response_key is not None:
            update[response_key] = {
                "traceId": reply.trace_id,
                "handlerAgentId": reply.handler_agent_id,
                "attempts": [a.model_dump(by_alias=True) for a in reply.attempts],
            }
        return update

    node.__name__ = f"reach_{task}"
    return node


async def _streamed(
    caller: ReachClient, task: str, payload: dict[str, Any], options: dict[str, Any]
) -> tuple[ReachResponse, list[Any]]:
    """A streamed call whose chunks go to the graph's custom stream as they come."""
    write = get_stream_writer()
    chunks: list[Any] = []
    async with caller.stream(task, payload, **options) as answer:
        async for chunk in answer:
            chunks.append(chunk)
            write({"task": task, "chunk": chunk})
    return answer.response, chunks


def branch_on(status_key: str = "reach_status", *, failure: str | None = None) -> Callable[[State], str]:
    """The path function of a conditional edge: the status the last Reach node wrote.

    With ``failure``, every status but ``SUCCESS`` goes to that one path, so a path map of two
    entries covers them all (a status missing from a path map is a KeyError inside LangGraph).
    """

    def route(state: State) -> str:
        status = str(state.get(status_key) or Status.SUCCESS)
        return status if failure is None or status == Status.SUCCESS else failure

    return route


def graph_agent(  # noqa: PLR0913 - the profile's fields, one keyword each
    graph: Any,
    *,
    agent_id: str,
    task: str,
    endpoint: str,
    router_url: str | None = None,
    description: str = "",
    examples: Sequence[str] = (),
    input_schema: dict[str, Any] | None = None,
    output_key: str | None = None,
    max_concurrency: int | None = None,
) -> ReachAgent:
    """A Reach agent whose one capability ``task`` runs ``graph`` (anything with ``ainvoke``).

    The payload is the graph's input state; the answer is the final state (or its
    ``output_key``). The run's thread id is the request's ``conversationId`` (else its trace
    id), so a checkpointed graph keeps one thread per conversation. ``max_concurrency``: the
    most runs at once, declared in the profile (the Router queues the rest).
    """
    capability: dict[str, Any] = {"task": task, "description": description, "examples": list(examples)}
    if input_schema is not None:
        capability["input_schema"] = input_schema
    agent = single_capability_agent(
        agent_id, endpoint, capability, router_url, f"graph_agent({agent_id})", max_concurrency
    )

    @agent.capability(task)
    async def run_graph(payload: dict[str, Any], ctx: ReachContext) -> Any:
        config: RunnableConfig = {"configurable": {"thread_id": ctx.conversation_id or ctx.trace_id}}
        final = await graph.ainvoke(payload, config=config)
        return final.get(output_key) if output_key is not None else final

    return agent


def serve_graph(graph: Any, **profile: Any) -> None:
    """Serve ``graph`` as a Reach agent until SIGTERM (blocking): :func:`graph_agent` + run."""
    graph_agent(graph, **profile).run()


__all__ = ["STRUCTURED_FAILURES", "branch_on", "graph_agent", "payload_from", "reach_node", "serve_graph"]
