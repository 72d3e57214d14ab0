"""Issue 14 end to end: poison published into the log of a running `rally up`-style cluster stops nothing.

`b"\\x00junk"` and a well-formed `JobSubmitted.v2` go raw onto `rally.job.x` while every service runs as
its own process; a job submitted afterwards completes, a restarted job controller catches up over both
(no crash loop) and runs the next one, the API reports the newer version, and a fresh replay of the
log gives the API's state hash and lists both sequences.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint.cli.replay import replay_state
from rallypoint.eventlog import EventLog
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow

JUNK = b"\x00junk"
V2 = b'{"type":"JobSubmitted.v2","job_id":"j-v2","spec":{"name":"x"},"submitted_at":1.0,"band":3}'
TERMINAL = {"completed", "failed", "cancelled", "rejected"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    env = dict(os.environ, RALLY_SNAPSHOT_EVERY="5", RALLY_SNAPSHOT_CHECK_S="1")
    local = LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=2, gpus_per_node=8, racks=1, env=env)
    with local:
        yield local


def publish_poison(cluster: LocalCluster) -> list[int]:
    async def publish() -> list[int]:
        log = await EventLog.connect(cluster.nats_url, name="e2e-poison", create=False)
        try:
            return [
                int((await log.js.publish("rally.job.x", data, stream=log.stream)).seq) for data in (JUNK, V2)
            ]
        finally:
            await log.close()

    return asyncio.run(publish())


def submit(cluster: LocalCluster, name: str, probes: Path) -> str:
    command = [
        sys.executable,
        "-m",
        "rallypoint.localcluster.rankprobe",
        "--out",
        str(probes),
        "--sleep",
        "0.2",
    ]
    body = {"name": name, "team": "e2e", "gpus": 2, "gpus_per_task": 2, "command": command}
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs", body)
    assert status == 202, answer
    return str(answer["job_id"])


def wait_terminal(cluster: LocalCluster, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, view = call("GET", f"{cluster.api_url}/v1/jobs/{job_id}")
        assert status == 200, view  # never a 404 for a job the API accepted
        if view["state"] in TERMINAL:
            return view
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never finished; last seen {view}; dead: {cluster.dead_services()}")


def test_poison_stops_nothing_and_every_fold_agrees(cluster: LocalCluster, tmp_path: Path) -> None:
    poison = publish_poison(cluster)
    probes = cluster.give_to_ranks(cluster.shared_dir / tmp_path.name)  # ranks are unprivileged (issue 30)
    assert wait_terminal(cluster, submit(cluster, "after-poison", probes))["state"] == "completed"

    # A restarted service catches up over both messages instead of crash-looping, and acts on the next job.
    cluster.kill("job-controller", signal.SIGKILL)
    cluster.restart("job-controller")
    assert wait_terminal(cluster, submit(cluster, "after-restart", probes))["state"] == "completed"
    assert not cluster.dead_services()

    status, health = call("GET", f"{cluster.api_url}/healthz")
    assert status == 200 and health["status"] == "degraded"
    assert "JobSubmitted.v2" in health["degraded"][0]

    status, state = call("GET", f"{cluster.api_url}/v1/state")
    assert status == 200
    replayed = asyncio.run(replay_state(cluster.nats_url, int(state["seq"])))
    assert replayed["hash"] == state["hash"]
    assert [q["seq"] for q in replayed["quarantined"]] == poison  # type: ignore[attr-defined]
