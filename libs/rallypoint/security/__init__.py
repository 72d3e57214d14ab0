"""Who may write what: the NATS permission matrix, the configs rendered from it, credentials, setup."""

from .permissions import (
    ADMIN,
    AGENT,
    MATRIX,
    ROLES,
    SERVICE_ROLES,
    Permissions,
    agent_permissions,
    agent_user,
    permissions,
)

__all__ = [
    "ADMIN",
    "AGENT",
    "MATRIX",
    "ROLES",
    "SERVICE_ROLES",
    "Permissions",
    "agent_permissions",
    "agent_user",
    "permissions",
]
