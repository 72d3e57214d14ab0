"""The NATS server's accounts and users, rendered from the permission matrix (``permissions``).

One renderer for every place a server runs: ``deploy/nats/accounts.conf`` (docker compose), the
``accounts.conf`` of the Kubernetes ConfigMap in ``deploy/k8s/nats.yaml``, and the local cluster's server
(``rallypoint.infra.NatsServer(accounts=...)``). The deploy files reference passwords as environment
variables (``$RALLY_NATS_<USER>_PASSWORD``: the server refuses to start when one is unset); the local
cluster writes its own random ones into a 0600 file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from .permissions import ROLES, Permissions, agent_permissions, agent_user, permissions

SYSTEM_USER = "sys"

HEADER = """\
# Rallypoint NATS accounts and per-subject permissions.
#
# GENERATED from rallypoint.security.permissions by `rally nats config` -- do not edit by hand;
# tests/unit/test_deploy_files.py fails when this file drifts from the matrix. docs/deployment.md,
# "Who may write what", explains it.
#
# Passwords are environment-variable references: the server refuses to start when one is unset.
# A password must not look like a number (the config parser would read it as one): `openssl rand -hex 24`
# prefixed with a letter is fine. They may be embedded in nats:// URLs, so keep them URL-safe.
#
# Every service user publishes only the event subjects it writes and the JetStream API calls it makes
# (read the log, its leader-lease key, snapshots); no user but admin may create, update, delete or purge
# a stream. A write outside these is dropped by the server. Each node agent is its own user and speaks
# only for its node.
"""


def password_variable(user: str) -> str:
    """``api`` -> ``RALLY_NATS_API_PASSWORD``; ``agent-gpu-1`` -> ``RALLY_NATS_AGENT_GPU_1_PASSWORD``."""
    return f"RALLY_NATS_{user.upper().replace('-', '_')}_PASSWORD"


def env_reference(user: str) -> str:
    return f"${password_variable(user)}"


def literal(passwords: dict[str, str]) -> Callable[[str], str]:
    """Password values written into the config itself (the local cluster's own throwaway server)."""
    return lambda user: json.dumps(passwords[user])


def users(agent_nodes: Sequence[str]) -> dict[str, Permissions]:
    """Every user of account RALLY, in config order: admin, the services, one agent per node."""
    table = {role: permissions(role) for role in ROLES}
    for node_id in agent_nodes:
        table[agent_user(node_id)] = agent_permissions(node_id)
    variables = [password_variable(user) for user in (*table, SYSTEM_USER)]
    if len(set(variables)) != len(variables):
        raise ValueError("two users map to one password variable (node ids differing only in - and _?)")
    return table


def _subject_list(items: Sequence[str], indent: str) -> str:
    inner = "".join(f"{indent}  {json.dumps(s)}\n" for s in items)
    return f"[\n{inner}{indent}]"


def _user_block(user: str, perms: Permissions, password: str) -> str:
    pad = " " * 6
    lines = [
        f"{pad}# {user}: {perms.writes}",
        f"{pad}{{",
        f"{pad}  user: {json.dumps(user)}, password: {password}",
        f"{pad}  permissions: {{",
        f"{pad}    publish: {{ allow: {_subject_list(perms.publish, pad + '    ')} }}",
        f"{pad}    subscribe: {{ allow: {_subject_list(perms.subscribe, pad + '    ')} }}",
    ]
    if perms.allow_responses:
        lines.append(f"{pad}    allow_responses: true")
    lines += [f"{pad}  }}", f"{pad}}}"]
    return "\n".join(lines)


def render_accounts(agent_nodes: Sequence[str], *, password: Callable[[str], str] = env_reference) -> str:
    """The ``accounts`` block (with ``system_account``) for a server whose agents run on ``agent_nodes``."""
    blocks = "\n\n".join(
        _user_block(user, perms, password(user)) for user, perms in users(agent_nodes).items()
    )
    return (
        f"{HEADER}\n"
        "accounts {\n"
        "  SYS {\n"
        f"    users: [\n      {{ user: {SYSTEM_USER}, password: {password(SYSTEM_USER)} }}\n    ]\n"
        "  }\n\n"
        "  RALLY {\n"
        "    jetstream: enabled\n"
        "    users: [\n"
        f"{blocks}\n"
        "    ]\n"
        "  }\n"
        "}\n\n"
        "system_account: SYS\n"
    )
