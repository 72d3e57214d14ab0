"""The dashboard while the event log is unreachable, in a real headless browser (docs/api.md, "Reading what
was written").

A real nats-server under a real API served on a port, the page open in Chromium: the server is stopped,
the API's plain reads answer 503 ``log-unavailable``, and the page asks again with ``?stale=true``: it keeps
showing the cluster from the API's fold and says so in a banner naming the log position. The server comes
back on the same port and store: the API reconnects, the reads are linearizable again, and the banner goes.
Screenshots go to ``$RALLY_SCREENSHOTS`` (default: the test's tmp dir). Skipped where Chromium is absent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

# this folder is on sys.path (rootdir-relative imports)
from headless_browser import CHROMIUM, chromium, screenshots
from rallypoint_services.api import build_app

from rallypoint.eventlog import EventLog
from rallypoint.events import GpuInfo, JobSpec, JobSubmitted, NodeRegistered, subjects
from rallypoint.infra import NatsServer
from rallypoint.infra.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install -y chromium)"),
]

NODES = ("n0", "n1")
BANNER_SHOWN = "(b => !b.hidden && b.textContent)(document.getElementById('stale-banner'))"
BANNER_HIDDEN = "document.getElementById('stale-banner').hidden"
HEAT_MAP_NODES = "[...document.querySelectorAll('g.node')].map(n => n.dataset.node).sort().join(',')"


async def _fill(log: EventLog) -> int:
    """Two 8-GPU nodes and a job that waits for 64 GPUs; the log's last sequence."""
    for i, node in enumerate(NODES):
        gpus = tuple(
            GpuInfo(index=g, uuid=f"GPU-{i}-{g}", memory_mib=81559, nvlink_domain=0) for g in range(8)
        )
        event = NodeRegistered(
            node_id=node, address=f"10.0.0.{i}", rack="r0", gpu_type="H100", gpus=gpus,
            cpu_milli=96000, memory_mib=1 << 20, agent_instance="test", at=1.0,
        )  # fmt: skip
        subject = subjects.node_registration(node)
        await log.append(subject, event, msg_id=f"{node}:0:NodeRegistered", source="test")
    spec = JobSpec(
        name="too-big", team="demo", gpus=64, gpus_per_task=8, ranks_per_task=1, command=("sleep", "1")
    )
    job = JobSubmitted(job_id="job-stale", spec=spec, submitted_at=2.0)
    return await log.append(subjects.job("job-stale"), job, msg_id="job-stale:0:JobSubmitted", source="test")


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[str, NatsServer, int]]:
    """(the API's URL, its NATS server, the log's last sequence) with the API serving on a real port."""
    server = await NatsServer(tmp_path / "nats").astart()
    log = await EventLog.connect(server.url, name="dashboard-stale")
    runner = web.AppRunner(build_app(log))
    try:
        seq = await _fill(log)
        await runner.setup()
        port = free_port("127.0.0.1")
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"http://127.0.0.1:{port}", server, seq
    finally:
        await runner.cleanup()
        await log.close()
        await server.astop()


async def test_the_page_shows_the_last_known_view_under_a_banner_until_the_log_is_back(
    api: tuple[str, NatsServer, int], tmp_path: Path
) -> None:
    url, server, seq = api
    shots = screenshots(tmp_path)
    async with chromium(tmp_path / "profile") as browser:
        await browser.send("Page.navigate", url=f"{url}/#/")
        assert await browser.until(f"{HEAT_MAP_NODES} === '{','.join(NODES)}'", "both nodes in the heat map")
        assert await browser.evaluate(BANNER_HIDDEN), "no banner while the log answers"

        await server.astop(remove_data=False)
        text = await browser.until(BANNER_SHOWN, "the stale banner")
        assert "unreachable" in text and f"log position {seq}" in text, text
        # the view stays: the heat map and the waiting job, read from the API's fold
        assert await browser.evaluate(HEAT_MAP_NODES) == ",".join(NODES)
        await browser.until(
            "!!document.querySelector('tr.queue-row[data-job=\"job-stale\"]')", "the waiting job in the queue"
        )
        await browser.screenshot(shots / "stale.png")

        await server.astart()  # same port, same store: the API's connection comes back
        await browser.until(BANNER_HIDDEN, "the banner gone once the log answers again", timeout=60)
        assert await browser.evaluate(HEAT_MAP_NODES) == ",".join(NODES)
        await browser.screenshot(shots / "back.png")
    assert (shots / "stale.png").stat().st_size > 0
