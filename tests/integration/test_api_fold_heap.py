"""The API process settles its heap once its fold has caught up (``FoldFollower(settle=True)``), as
`rally serve api` asks: the caught-up fold is frozen out of the cyclic collector and young collections
run less often. Run in a child process each, because it changes that process's collector for good."""

from __future__ import annotations

import json
import subprocess
import sys

from rallypoint.eventlog import EventLog
from rallypoint.events import GpuInfo, NodeRegistered, subjects
from rallypoint.infra import NatsServer

CHILD = """
import asyncio, gc, json, sys
from rallypoint.eventlog import EventLog
from rallypoint_services.api.fold import FoldFollower

async def main() -> None:
    log = await EventLog.connect(sys.argv[1], name="heap-test", create=False)
    follower = FoldFollower(log, settle=sys.argv[2] == "settle")
    follower.start()
    assert await follower.wait_caught_up(20.0)
    young = gc.get_threshold()[0]
    out = {"nodes": len(follower.state.nodes), "frozen": gc.get_freeze_count(), "young": young}
    await follower.stop()
    await log.close()
    print(json.dumps(out))

asyncio.run(main())
"""


def _child(url: str, mode: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url, mode], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def test_settle_freezes_the_caught_up_fold_only_when_asked(
    nats_server: NatsServer, event_log: EventLog
) -> None:
    for i in range(3):
        gpus = tuple(GpuInfo(index=g, uuid=f"GPU-{i}-{g}", memory_mib=1, nvlink_domain=0) for g in range(8))
        node = NodeRegistered(
            node_id=f"n{i}",
            address="10.0.0.1",
            rack="r0",
            gpu_type="H100",
            gpus=gpus,
            cpu_milli=1000,
            memory_mib=1024,
            agent_instance="test",
            at=1.0,
        )
        await event_log.append(
            subjects.node_registration(f"n{i}"), node, msg_id=f"n{i}:0:NodeRegistered", source="t"
        )

    settled = _child(nats_server.url, "settle")
    assert settled["nodes"] == 3  # settled after the catch-up: the fold it froze is the whole log
    assert settled["frozen"] > 0
    assert settled["young"] == 50_000

    plain = _child(nats_server.url, "plain")
    assert plain["nodes"] == 3
    assert plain["frozen"] == 0
    assert plain["young"] == 700  # the interpreter's default, untouched
