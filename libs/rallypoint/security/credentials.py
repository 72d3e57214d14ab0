"""Credentials of a local cluster: one random password per NATS user, never written to a shared place.

Production passwords come from a secret store (docs/deployment.md, "Who may write what"); the local
cluster (``rally up``, the end-to-end tests) makes its own for each run, so its server enforces exactly
the production matrix.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from .natsconf import SYSTEM_USER
from .permissions import ROLES, agent_user


@dataclass(frozen=True, slots=True)
class LocalCredentials:
    passwords: dict[str, str] = field(repr=False)

    @classmethod
    def generate(cls, agent_nodes: Sequence[str]) -> LocalCredentials:
        users = (SYSTEM_USER, *ROLES, *(agent_user(node_id) for node_id in agent_nodes))
        # A letter first: the NATS config parser reads a number-like value as a number.
        return cls({user: f"p{secrets.token_hex(16)}" for user in users})

    def env_for(self, user: str) -> dict[str, str]:
        """What a service process needs in its environment to connect as ``user``."""
        return {"RALLY_NATS_USER": user, "RALLY_NATS_PASSWORD": self.passwords[user]}
