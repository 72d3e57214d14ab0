"""The checkpoint service reads (and retention removes) the steps ranks wrote as their jobs' own uids,
mode 0700: in the deploy files it runs as root with every capability dropped but DAC_READ_SEARCH and
DAC_OVERRIDE, and it is the only service besides the node agent that runs as root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "docker-compose.yml"
ACCESS = {"DAC_READ_SEARCH", "DAC_OVERRIDE"}


def _deployments() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "Deployment":
                found[doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]
    return found


def test_in_kubernetes_the_checkpoint_service_alone_reads_every_jobs_folder() -> None:
    pods = _deployments()
    checkpoint = pods.pop("rally-checkpoint")
    assert checkpoint["securityContext"]["runAsUser"] == 0
    (container,) = checkpoint["containers"]
    context = container["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"] and set(context["capabilities"]["add"]) == ACCESS
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    for name, pod in pods.items():
        assert pod["securityContext"].get("runAsNonRoot") is True, name
        for each in pod["containers"]:
            assert not each.get("securityContext", {}).get("capabilities", {}).get("add"), name


def test_in_compose_the_checkpoint_replicas_get_the_same_access() -> None:
    service = yaml.safe_load(COMPOSE.read_text())["services"]["checkpoint"]
    assert service["user"] == "0"
    assert service["cap_drop"] == ["ALL"] and set(service["cap_add"]) == ACCESS
