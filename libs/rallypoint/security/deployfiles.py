"""The deploy files rendered from the permission matrix: what `rally nats config` writes and a test checks.

- ``deploy/nats/accounts.conf`` (docker compose): the agents of the nodes in ``deploy/nats/agent-nodes.txt``;
- the ``accounts.conf`` key of the ConfigMap in ``deploy/k8s/nats.yaml``: the nodes in
  ``deploy/k8s/agent-nodes.txt`` (your GPU nodes: one agent user each).
"""

from __future__ import annotations

from pathlib import Path

from .natsconf import render_accounts

COMPOSE_ACCOUNTS = Path("deploy/nats/accounts.conf")
COMPOSE_NODES = Path("deploy/nats/agent-nodes.txt")
K8S_NATS = Path("deploy/k8s/nats.yaml")
K8S_NODES = Path("deploy/k8s/agent-nodes.txt")

_K8S_KEY = "  accounts.conf: |\n"
_K8S_INDENT = "    "


def read_nodes(path: Path) -> list[str]:
    """One node id a line; blank lines and ``#`` comments skipped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def splice_k8s_accounts(manifest: str, accounts: str) -> str:
    """``manifest`` with the ConfigMap's ``accounts.conf`` block replaced by ``accounts`` (indented)."""
    start = manifest.index(_K8S_KEY) + len(_K8S_KEY)
    end = manifest.index("\n---", start) + 1
    body = "".join(f"{_K8S_INDENT}{line}" if line.strip() else "\n" for line in accounts.splitlines(True))
    return manifest[:start] + body + manifest[end:]


def render(root: Path) -> dict[Path, str]:
    """Each generated file (relative to ``root``) -> the text it must have."""
    compose = render_accounts(read_nodes(root / COMPOSE_NODES))
    k8s = render_accounts(read_nodes(root / K8S_NODES))
    return {
        COMPOSE_ACCOUNTS: compose,
        K8S_NATS: splice_k8s_accounts((root / K8S_NATS).read_text(), k8s),
    }


def drifted(root: Path) -> list[Path]:
    """The generated files whose committed text differs from what the matrix renders."""
    return [path for path, text in render(root).items() if (root / path).read_text() != text]
