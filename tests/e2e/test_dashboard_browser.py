"""The web dashboard in a real headless browser (Debian's Chromium) against a real local cluster.

Chromium is driven over the DevTools protocol (a websocket, with aiohttp): the test loads the page the
API serves at ``/`` with the cluster's admin token in ``?token=``, then reads the rendered DOM. It checks
that the heat map shows every node of the cluster, that a job that must wait appears in the queue with
its reason and then on its GPUs once it binds, and that its job page draws its timeline (with the event
history and the rank-log panel). A page opened after jobs ran shows their usage from the log, the running
jobs in team colours that stay apart, a job on a drained node still on its GPUs marked draining, an
interrupted span with no two timeline labels overlapping, the history page's axes, counts and finished
jobs, and why a token was refused. Screenshots of
the pages go to ``$RALLY_SCREENSHOTS`` (default: the test's tmp dir). Skipped where Chromium is absent
(``apt-get install -y chromium``).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# this folder is on sys.path (rootdir-relative imports)
from headless_browser import CHROMIUM, Browser, chromium, screenshots

from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path_factory.mktemp("dashboard"), nodes=4, gpus_per_node=4, racks=2)
    with local:
        yield local


def submit(cluster: LocalCluster, name: str, gpus: int, **fields: object) -> str:
    body = {"name": name, "team": "demo", "gpus": gpus, "gpus_per_task": 4, "ranks_per_task": 1,
            "command": ["sleep", "300"], **fields}  # fmt: skip
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
        # its predicted start, once the predictor's next refresh has seen it: the job ahead has no history,
        # so it is expected to run an hour (docs/prediction.md) and the waiting job to start then
        start = await browser.until(
            f"(c => c && c.innerText.startsWith('in ') && c.innerText)(document.querySelector("
            f"'tr.queue-row[data-job=\"{waiting}\"] td.predicted-start'))",
            "the waiting job's predicted start",
            timeout=60,
        )
        assert "min" in start, start
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

        # a job that waits for it: its page names the dependency, a link to the job it waits for
        after = submit(cluster, "after-waiting", 4, depends_on=[{"kind": "after-ok", "job_id": waiting}])
        await browser.evaluate(f"location.hash = '#/job/{after}'")
        chain = await browser.until(
            "(d => d && d.innerText)(document.querySelector('span.depends-on'))", "the job's dependency"
        )
        assert chain == f"after-ok {waiting}", chain
        href = await browser.evaluate("document.querySelector('span.depends-on a').getAttribute('href')")
        assert href == f"#/job/{waiting}"
        page = await browser.evaluate("document.querySelector('#job').innerText")
        assert f"Dependency: waiting for {waiting} to complete (after-ok)" in page, page
        call("DELETE", f"{cluster.api_url}/v1/jobs/{after}")
    for name in ("cluster", "queue", "running", "job"):
        assert (shots / f"{name}.png").stat().st_size > 1000
    call("DELETE", f"{cluster.api_url}/v1/jobs/{waiting}")


# --- a page opened late: the past, the running jobs, drains, interruptions, history ---------------------

#: Every text of the job's timeline as a box: (left, top, right, bottom, text)
TIMELINE_BOXES = (
    "[...document.querySelectorAll('#timeline text')].map(t => "
    "(r => [r.left, r.top, r.right, r.bottom, t.textContent])(t.getBoundingClientRect()))"
)
#: A job that fails its first attempt and runs on the second: an interrupted span, then running again
FLAKY = ["sh", "-c", 'test "$RALLY_ATTEMPT" -ge 2 || exit 3; exec sleep 300']
DRAINING = "#d08a2e"  # the page's --drained and --unhealthy: no team may look like them
UNHEALTHY = "#d2423c"


def submit_as(cluster: LocalCluster, name: str, team: str, command: list[str], **fields: object) -> str:
    body = {"name": name, "team": team, "gpus": 4, "gpus_per_task": 4, "ranks_per_task": 1,
            "command": command, **fields}  # fmt: skip
    status, answer = call("POST", f"{cluster.api_url}/v1/jobs", body)
    assert status == 202, answer
    return str(answer["job_id"])


async def job_state(
    cluster: LocalCluster, job_id: str, want: set[str], timeout: float = 60.0
) -> dict[str, Any]:
    """The job's view once its state is one of ``want`` (waiting on the API, a generous deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        status, view = call("GET", f"{cluster.api_url}/v1/jobs/{job_id}")
        if status == 200 and view["state"] in want:
            return dict(view)
        assert time.monotonic() < deadline, f"{job_id} never reached {want}: {view}"
        await asyncio.sleep(0.25)


def overlapping(boxes: list[list[Any]]) -> list[tuple[str, str]]:
    """The pairs of texts whose boxes intersect (touching edges do not)."""
    return [
        (a[4], b[4])
        for a, b in itertools.combinations(boxes, 2)
        if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
    ]


def lab(colour: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of a CSS colour given as #rrggbb or rgb(r, g, b)."""
    if colour.startswith("#"):
        rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    else:
        rgb = [int(part) / 255 for part in colour[colour.index("(") + 1 : colour.index(")")].split(",")[:3]]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb)
    xyz = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)  # fmt: skip
    fx, fy, fz = (t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def delta_e(one: str, other: str) -> float:
    return math.dist(lab(one), lab(other))


COUNTED = (
    "[...document.querySelectorAll('#{chart} text.count')].reduce((n, t) => n + Number(t.textContent), 0)"
)
TEAM_COLOURS = (
    "Object.fromEntries(['demo', 'nlp'].map(t => [t, ["
    "getComputedStyle(document.querySelector(`tr.running-row i.swatch[data-team=${t}]`))"
    ".backgroundColor, document.querySelector(`rect.gpu[data-team=${t}]`).getAttribute('fill'), "
    "document.querySelector(`polyline.usage-line[data-team=${t}]`).getAttribute('stroke')]]))"
)


def inner_text(selector: str) -> str:
    return f"(e => e && e.innerText)(document.querySelector('{selector}'))"


async def usage_from_before_the_page_opened(browser: Browser, opened: float) -> None:
    lines = await browser.until(
        "(c => c && c.querySelectorAll('polyline.usage-line').length >= 2 && "
        "[...c.querySelectorAll('polyline.usage-line')].map(l => l.dataset.team))"
        "(document.getElementById('usage-chart'))",
        "the usage chart's lines",
    )
    assert {"demo", "nlp"} <= set(lines), lines
    since = float(await browser.evaluate("document.getElementById('usage-chart').dataset.since"))
    assert since < opened - 1, (since, opened)
    texts = await browser.evaluate(
        "[...document.querySelectorAll('#usage-chart text')].map(t => t.textContent)"
    )
    assert "GPUs" in texts and "16" in texts and any(t.startswith("time (UTC)") for t in texts), texts


async def running_jobs_in_distinct_team_colours(browser: Browser, jobs: set[str]) -> None:
    running = await browser.until(
        "(rows => rows.length >= 2 && rows.map(r => r.dataset.job))"
        "([...document.querySelectorAll('tr.running-row')])",
        "the running jobs list",
    )
    assert jobs <= set(running)
    # one colour per team wherever it is shown: the list's swatch, its GPUs, its usage line
    for team, (swatch, gpu_fill, line) in (await browser.evaluate(TEAM_COLOURS)).items():
        assert delta_e(swatch, gpu_fill) < 1 and gpu_fill == line, (team, swatch, gpu_fill, line)
    # eight teams (the four configured and four more) of which no two look alike, none like the
    # draining orange or the unhealthy red
    palette = await browser.evaluate("['bench', 'demo', 'nlp', 'vision', 'w', 'x', 'y', 'z'].map(teamColor)")
    closest = min(delta_e(a, b) for a, b in itertools.combinations(palette, 2))
    assert closest >= 40, (closest, palette)
    assert min(delta_e(c, r) for c in palette for r in (DRAINING, UNHEALTHY)) >= 30, palette


async def job_stays_on_its_drained_node(
    browser: Browser, cluster: LocalCluster, job_id: str, node: str
) -> None:
    status, answer = call("POST", f"{cluster.api_url}/v1/nodes/{node}/drain", {"reason": "maintenance"})
    assert status in (200, 202), answer
    marked = await browser.until(
        f"(g => g.length === 4 && g.map(r => r.dataset.node))([...document.querySelectorAll("
        f'\'rect.gpu[data-job="{job_id}"][data-draining="true"]\')])',
        "the job on the drained node's GPUs, marked draining",
    )
    assert set(marked) == {node}
    row = await browser.until(inner_text(f'tr.running-row[data-job="{job_id}"][data-draining]'), "its row")
    assert f"node {node} draining" in row, row


async def interrupted_span_marked_labels_apart(browser: Browser, job_id: str) -> None:
    await browser.evaluate(f"location.hash = '#/job/{job_id}'")
    span = await browser.until(
        "(r => r && r.getBoundingClientRect().width > 0 && r.dataset.label)"
        "(document.querySelector('#timeline rect.interrupted'))",
        "the interrupted span on the timeline",
    )
    assert span == "attempt failed"
    labels = await browser.evaluate(
        "[...document.querySelectorAll('#timeline g.milestone')].map(g => g.dataset.label)"
    )
    assert labels[:4] == ["submitted", "bound", "running", "attempt failed"], labels
    assert await browser.evaluate("!!document.querySelector('#timeline g.interrupted-label')")
    boxes = await browser.evaluate(TIMELINE_BOXES)
    assert len(boxes) >= 2 * len(labels) and overlapping(boxes) == [], overlapping(boxes)


async def history_with_axes_counts_and_table(browser: Browser, completed: str) -> None:
    await browser.evaluate("location.hash = '#/history'")
    # the table as drawn once it holds the completed job (a first drawing may come from an answer read
    # before the page switched here, and the page redraws on its refresh)
    finished = await browser.until(
        f"(jobs => jobs.includes('{completed}') && jobs)"
        "([...document.querySelectorAll('tr.finished-row')].map(r => r.dataset.job))",
        "the finished-jobs table with the completed job",
    )
    row = await browser.until(inner_text(f'tr.finished-row[data-job="{completed}"]'), "its row's text")
    assert "quick" in row and "bench" in row and "completed" in row, row
    for chart in ("queue-time", "jct"):
        # One reading of the chart, taken again while the page redraws it (its refresh replaces the SVG).
        counted, titles, ticks = await browser.until(
            f"(c => c[1].length && c)([{COUNTED.format(chart=chart)}, "
            f"[...document.querySelectorAll('#{chart} text.axis-title')].map(t => t.textContent), "
            f"document.querySelectorAll('#{chart} text.tick').length])",
            f"the {chart} chart drawn",
        )
        assert counted == len(finished), (chart, counted, finished)
        assert "jobs" in titles and len(titles) == 2, titles
        assert ticks >= 4, (chart, ticks)


async def refused_token_says_why_and_what_to_do(browser: Browser, cluster: LocalCluster) -> None:
    await browser.send("Page.navigate", url=f"{cluster.api_url}/?token=not-a-token-of-this-cluster#/")
    refused = await browser.until(
        "(l => l && !l.hidden && document.getElementById('login-error').textContent)"
        "(document.getElementById('login'))",
        "the refusal of the token",
    )
    assert "HTTP 401" in refused and "another cluster" in refused and "rally tokens create" in refused


def usage_history_is_a_team_tokens_own(cluster: LocalCluster) -> None:
    url, nlp = f"{cluster.api_url}/v1/usage/history", cluster.token_for("nlp")
    status, series = call("GET", url, token=nlp)
    assert status == 200 and [t["team"] for t in series["teams"]] == ["nlp"], series
    status, refused = call("GET", f"{url}?team=demo", token=nlp)
    assert status == 403 and refused["field"] == "team", refused


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install -y chromium)")
async def test_a_page_opened_late_shows_usage_running_jobs_drains_interruptions_and_history(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    shots = screenshots(tmp_path)
    completed = submit_as(cluster, "quick", "bench", ["true"])
    stays = submit_as(cluster, "stays-on-drain", "demo", ["sleep", "300"])  # checkpoint class: it stays
    flaky = submit_as(cluster, "flaky", "nlp", FLAKY, max_retries=2)
    await job_state(cluster, completed, {"completed"})
    node = (await job_state(cluster, stays, {"running"}))["nodes"][0]
    await job_state(cluster, flaky, {"running"})
    usage_history_is_a_team_tokens_own(cluster)
    try:
        async with chromium(tmp_path / "profile") as browser:
            opened = await browser.evaluate("Date.now() / 1000")
            await browser.send("Page.navigate", url=f"{cluster.api_url}/?token={cluster.admin_token}#/")
            await usage_from_before_the_page_opened(browser, opened)
            await running_jobs_in_distinct_team_colours(browser, {stays, flaky})
            await browser.screenshot(shots / "late.png")
            await job_stays_on_its_drained_node(browser, cluster, stays, node)
            await browser.screenshot(shots / "draining.png")
            await interrupted_span_marked_labels_apart(browser, flaky)
            await browser.screenshot(shots / "interrupted.png")
            await history_with_axes_counts_and_table(browser, completed)
            await browser.screenshot(shots / "history.png")
            await refused_token_says_why_and_what_to_do(browser, cluster)
            await browser.screenshot(shots / "refused.png")
    finally:
        call("POST", f"{cluster.api_url}/v1/nodes/{node}/undrain", {"reason": "done"})
        for job_id in (stays, flaky):
            call("DELETE", f"{cluster.api_url}/v1/jobs/{job_id}")
