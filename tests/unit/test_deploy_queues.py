"""Every deployment runs the API and both schedulers with one queue file (issue 19: none passed --queues):
compose mounts deploy/queues.yaml, Kubernetes the ConfigMap rally-queues with the same content, and the
file is one the services' reader accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rallypoint.scheduling.queues import load_queues, queues_from_obj

ROOT = Path(__file__).resolve().parents[2]
QUEUES = ROOT / "deploy" / "queues.yaml"
READERS = ("api", "scheduler")


def _arg(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_the_deployed_queue_file_is_valid_with_orgs_and_cohorts() -> None:
    q = load_queues(QUEUES)
    assert q.orgs and q.cohorts and q.teams
    assert all(q.lineage(t.name) or t.parent is None for t in q.teams)


def test_compose_gives_the_api_and_both_schedulers_the_file() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    readers = {
        name: spec
        for name, spec in compose["services"].items()
        if spec.get("command", [])[:1] == ["serve"] and spec["command"][1] in READERS
    }
    assert sorted(spec["command"][1] for spec in readers.values()) == ["api", "scheduler", "scheduler"]
    for name, spec in readers.items():
        inside = _arg(spec["command"], "--queues")
        assert inside is not None, name
        assert f"./deploy/queues.yaml:{inside}:ro" in spec["volumes"], name


def _k8s(kind: str, name: str) -> dict[str, Any]:
    for path in sorted((ROOT / "deploy" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == kind and doc["metadata"]["name"] == name:
                return dict(doc)
    raise AssertionError(f"no {kind} {name}")


def test_kubernetes_mounts_the_same_file_into_the_api_and_the_schedulers() -> None:
    config_map = _k8s("ConfigMap", "rally-queues")
    assert yaml.safe_load(config_map["data"]["queues.yaml"]) == yaml.safe_load(QUEUES.read_text())
    queues_from_obj(yaml.safe_load(config_map["data"]["queues.yaml"]))
    for name in ("rally-api", "rally-scheduler"):
        pod = _k8s("Deployment", name)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        path = Path(_arg(container["args"], "--queues") or "")
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        volume = next(n for n, v in volumes.items() if v.get("configMap", {}).get("name") == "rally-queues")
        assert mounts[volume] == str(path.parent) and path.name == "queues.yaml", name
