"""The web dashboard in a real headless browser (Debian's Chromium) against a real local cluster.

Chromium is driven over the DevTools protocol (a websocket, with aiohttp): the test loads the page the
API serves at ``/`` with the cluster's admin token in ``?token=``, then reads the rendered DOM. It checks
that the heat map shows every node of the cluster, that a job that must wait appears in the queue with
its reason and then on its GPUs once it binds, and that its job page draws its timeline (with the event
history and the rank-log panel). Screenshots of
the pages go to ``$RALLY_SCREENSHOTS`` (default: the test's tmp dir). Skipped where Chromium is absent
(``apt-get install -y chromium``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# this folder is on sys.path (rootdir-relative imports)
from headless_browser import CHROMIUM, chromium, screenshots

from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("dashboard"), nodes=4, gpus_per_node=4, racks=2)
    with local:
        yield local


def submit(cluster: LocalCluster, name: str, gpus: int) -> str:
    body = {"name": name, "team": "demo", "gpus": gpus, "gpus_per_task": 4, "ranks_per_task": 1,
            "command": ["sleep", "300"]}  # fmt: skip
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs", body)
    assert status == 202, answer
    return str(answer["job_id"])


def test_the_page_and_its_files_are_public_the_data_is_not(cluster: LocalCluster) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{cluster.api_url}/", timeout=5) as page:
        assert page.status == 200 and b"dashboard.js" in page.read()
    with urllib.request.urlopen(f"{cluster.api_url}/dashboard/dashboard.js", timeout=5) as script:
        assert script.status == 200
    assert call("GET", f"{cluster.api_url}/v1/jobs", token="")[0] == 401
    assert call("GET", f"{cluster.api_url}/dashboard/../v1/jobs", token="")[0] in (403, 404)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install -y chromium)")
async def test_heat_map_queue_gpus_and_job_timeline_in_a_headless_browser(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    shots = screenshots(tmp_path)
    async with chromium(tmp_path / "profile") as browser:
        await browser.send("Page.navigate", url=f"{cluster.api_url}/?token={cluster.admin_token}#/")
        nodes = await browser.until(
            "document.querySelectorAll('g.node').length === 4 && "
            "[...document.querySelectorAll('g.node')].map(n => n.dataset.node)",
            "every node in the heat map",
        )
        assert sorted(nodes) == sorted(cluster.node_ids())
        assert await browser.evaluate("document.querySelectorAll('rect.gpu').length") == 16
        assert await browser.evaluate("location.search") == "", "the token leaves the address bar"
        await browser.screenshot(shots / "cluster.png")

        # a job holding every GPU, then one that must wait: it shows in the queue with its reason
        whole = submit(cluster, "whole-cluster", 16)
        await browser.until(
            f"document.querySelectorAll('rect.gpu[data-job=\"{whole}\"]').length === 16",
            "the first job's GPUs",
        )
        waiting = submit(cluster, "waiting", 4)
        row = await browser.until(
            f"(r => r && r.innerText)(document.querySelector('tr.queue-row[data-job=\"{waiting}\"]'))",
            "the waiting job in the queue",
        )
        assert "waiting" in row and "demo" in row
        await browser.screenshot(shots / "queue.png")

        # the first job ends: the waiting one binds and its 4 GPUs show it, in one node
        assert call("DELETE", f"{cluster.api_url}/v1/jobs/{whole}")[0] in (200, 202)
        held = await browser.until(
            f"(g => g.length === 4 && g.map(r => r.dataset.node))"
            f"([...document.querySelectorAll('rect.gpu[data-job=\"{waiting}\"]')])",
            "the waiting job on its GPUs",
            timeout=45,
        )
        assert len(set(held)) == 1
        assert not await browser.evaluate(f"!!document.querySelector('tr.queue-row[data-job=\"{waiting}\"]')")
        await browser.screenshot(shots / "running.png")

        # its job page: the timeline from submission to running
        await browser.evaluate(f"location.hash = '#/job/{waiting}'")
        labels = await browser.until(
            "(m => m.includes('running') && m)([...document.querySelectorAll('#timeline g.milestone')]"
            ".map(g => g.dataset.label))",
            "the job's timeline",
        )
        assert labels[:3] == ["submitted", "bound", "running"], labels
        assert await browser.evaluate("document.querySelector('#job').dataset.state") == "running"
        events = await browser.evaluate(
            "[...document.querySelectorAll('tr.event-row')].map(r => r.innerText)"
        )
        assert any("JobSubmitted" in e for e in events) and any("JobStarted" in e for e in events), events
        assert await browser.evaluate("!!document.querySelector('#rank-log')"), "the rank log panel"
        await browser.screenshot(shots / "job.png")
    for name in ("cluster", "queue", "running", "job"):
        assert (shots / f"{name}.png").stat().st_size > 1000
    call("DELETE", f"{cluster.api_url}/v1/jobs/{waiting}")
