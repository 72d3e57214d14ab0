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

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium page over the DevTools protocol: navigate, evaluate, screenshot."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        await self.ws.send_json({"id": message_id, "method": method, "params": params})
        while True:  # events arrive in between; the answer carries our id
            message = json.loads((await self.ws.receive(timeout=30)).data)
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def until(self, expression: str, what: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.25)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Browser]:
    assert CHROMIUM is not None
    argv = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1400,900",
            "about:blank"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None, "chromium did not start"
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                browser = Browser(ws)
                await browser.send("Page.enable")
                await browser.send("Emulation.setDeviceMetricsOverride", width=1400, height=900,
                                   deviceScaleFactor=1, mobile=False)  # fmt: skip
                yield browser
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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


def screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("RALLY_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
