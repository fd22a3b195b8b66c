"""The key layout under one prefix, and the names a Router gives its secrets and itself."""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
from urllib.parse import quote


def new_secret_lease() -> str:
    """A lease id for an agent: 128 random bits (the store keeps only their digest)."""
    return "0x" + secrets.token_hex(16)


def router_name() -> str:
    """This Router's name in failure reports: host, process and a random tag (unique per start)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class Keys:
    """The key layout under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.root = prefix + "/"
        self.agents = prefix + "/agents/"
        self.health = prefix + "/health/"
        self.vectors = prefix + "/vectors/"
        self.learned = prefix + "/learned/"
        self.negatives = prefix + "/negative/"
        # Never written: a read of it, and a write to it that is checked but never done, tell
        # whether etcd lets this Router read and write the prefix.
        self.access_check = prefix + "/access-check"

    def agent(self, agent_id: str) -> str:
        return self.agents + agent_id

    def failure(self, agent_id: str, router: str) -> str:
        return f"{self.health}{agent_id}/{router}"

    def vector_block(self, model: str, agent_id: str) -> str:
        return f"{self.vectors}{quote(model, safe='')}/{agent_id}"

    def negative(self, phrase_key: str, task: str, agent: str) -> str:
        return self.negatives + hashlib.sha256(f"{phrase_key}\0{task}\0{agent}".encode()).hexdigest()

    def learned_route(self, phrase_key: str) -> str:
        """``phrase_key`` is a LearnedRoute.key: the phrase, and its owner when it has one."""
        # A digest, not the phrase: caller text never becomes part of a key.
        return self.learned + hashlib.sha256(phrase_key.encode()).hexdigest()
