"""The agent SDK: :class:`ReachAgent` to serve capabilities, :class:`ReachClient` to call them."""

from agent_reach.sdk.agent import AgentError, ReachAgent, ReachContext
from agent_reach.sdk.client import ReachClient, SyncReachClient
from agent_reach.sdk.config import AgentConfig

__all__ = ["AgentConfig", "AgentError", "ReachAgent", "ReachClient", "ReachContext", "SyncReachClient"]
