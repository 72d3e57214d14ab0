"""`rally show | history | usage | logs -f | queues` on a real local cluster, through the CLI's main.

One cluster (2 nodes x 4 GPUs, a queue file with two teams in one cohort) runs one story for the whole
module: a job that completes; one that fails, is retried and fails again; two best-effort gangs of a team
borrowing GPUs, one of them preempted when the lending team reclaims its quota, run again, then
cancelled. Each test then asks one command about it with ``-o json``; usage is checked against a fold of
the log and against the PostgreSQL read model.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from rallypoint.accounting import fold_attempts, usage
from rallypoint.cli.main import main
from rallypoint.cli.replay import read_history
from rallypoint.localcluster import LocalCluster
from rallypoint.localcluster.http import call

pytestmark = pytest.mark.slow

TERMINAL = {"completed", "failed", "cancelled", "rejected"}
QUEUES = {
    "cohorts": [{"name": "all"}],
    "teams": [
        {"name": "lang", "cohort": "all", "nominal": 4},
        {"name": "vision", "cohort": "all", "nominal": 4},
    ],
}


@dataclass
class Story:
    cluster: LocalCluster
    done: str
    retried: str
    preempted: str
    urgent: str


def submit(api: str, name: str, team: str, gpus: int, command: list[str], **extra: Any) -> str:
    body = {
        "name": name,
        "team": team,
        "gpus": gpus,
        "gpus_per_task": min(gpus, 4),
        "command": command,
        **extra,
    }
    status, answer = call("POST", f"{api}/v1/jobs", body)
    assert status == 202, answer
    return str(answer["job_id"])


def wait(api: str, job_id: str, states: set[str], *, attempt: int = 0, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, view = call("GET", f"{api}/v1/jobs/{job_id}")
        if status == 200 and view["state"] in states and view["attempt"] >= attempt:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{job_id} never reached {states} (attempt >= {attempt})")


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    work = tmp_path_factory.mktemp("user-commands")
    queues = work / "queues.json"
    queues.write_text(json.dumps(QUEUES))
    with LocalCluster(work / "cluster", nodes=2, gpus_per_node=4, racks=1, queues=queues) as cluster:
        api = cluster.api_url
        saved = {k: os.environ.get(k) for k in ("RALLY_API_URL", "RALLY_TOKEN")}
        os.environ.update(RALLY_API_URL=api, RALLY_TOKEN=cluster.admin_token)
        try:
            done = submit(api, "done", "lang", 2, ["sh", "-c", "echo hello; sleep 0.3"])
            retried = submit(api, "retried", "lang", 2, ["sh", "-c", "echo failing; exit 3"], max_retries=1)
            for job_id in (done, retried):
                wait(api, job_id, TERMINAL)
            fillers = [
                submit(api, f"filler-{i}", "vision", 4, ["sleep", "300"], priority="best-effort")
                for i in range(2)
            ]
            for filler in fillers:
                wait(api, filler, {"running"})
            # lang reclaims its nominal 4 GPUs from vision, which borrowed them: one filler is preempted
            urgent = submit(api, "urgent", "lang", 4, ["sleep", "1"], priority="production")
            wait(api, urgent, TERMINAL)
            for filler in fillers:
                wait(api, filler, {"running"})
            preempted = [f for f in fillers if call("GET", f"{api}/v1/jobs/{f}")[1]["attempt"] == 2]
            for filler in fillers:
                call("DELETE", f"{api}/v1/jobs/{filler}")
            for filler in fillers:
                wait(api, filler, TERMINAL)
            assert len(preempted) == 1, "one filler was preempted and ran again"
            yield Story(cluster, done, retried, preempted[0], urgent)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def rally_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    assert main([*argv, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_show_tells_every_attempt_and_who_preempted_it(
    story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = rally_json(capsys, "show", story.preempted)
    assert shown["state"] == "cancelled"
    first, second = shown["attempts"]
    assert (first["outcome"], first["preempted_for"], second["outcome"]) == (
        "preempted",
        story.urgent,
        "cancelled",
    )
    assert first["placements"] and first["started_at"] < first["ended_at"] <= second["bound_at"]
    (preemption,) = shown["preemptions"]
    assert preemption["for_job"] == story.urgent and preemption["requested_at"] <= preemption["preempted_at"]
    assert shown["reasons"], "a preempted job waits again, with a reason"
    assert shown["cancel_requested_by"] == "admin"
    retried = rally_json(capsys, "show", story.retried)
    assert [(a["attempt"], a["outcome"]) for a in retried["attempts"]] == [
        (1, "attempt-failed"),
        (2, "failed"),
    ]
    assert [s["kind"] for s in retried["recovery"]] == ["attempt-failed"]
    assert main(["show", story.preempted]) == 0
    assert f"JobId={story.preempted}" in capsys.readouterr().out


def test_history_lists_finished_jobs_like_sacct(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    answer = rally_json(capsys, "history", "--team", "lang")
    rows = {j["job_id"]: j for j in answer["jobs"]}
    assert set(rows) == {story.done, story.retried, story.urgent}
    assert (
        rows[story.retried]["state"],
        rows[story.retried]["attempts"],
        rows[story.retried]["exit_code"],
    ) == (
        "failed",
        2,
        3,
    )
    assert rows[story.done]["gpu_s"] > 0 and rows[story.done]["queue_s"] >= 0
    failed = rally_json(capsys, "history", "--state", "failed")
    assert [j["job_id"] for j in failed["jobs"]] == [story.retried]
    assert main(["history", "--since", "1d"]) == 0
    assert "GPU-H" in capsys.readouterr().out


def _projected(story: Story) -> None:
    """Wait until the projector has written the whole log to PostgreSQL."""

    async def positions() -> tuple[int, int]:
        history = await read_history(story.cluster.nats_url, None)
        conn = await asyncpg.connect(story.cluster.postgres_dsn)
        try:
            projected = await conn.fetchval("SELECT max(seq) FROM rally.projection_position")
        finally:
            await conn.close()
        return history[-1][0], int(projected or 0)

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        last, projected = asyncio.run(positions())
        if projected >= last:
            return
        time.sleep(0.3)
    raise TimeoutError("the projector did not catch up")


def test_usage_equals_a_fold_of_the_log_and_the_read_model(
    story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    from_api = rally_json(capsys, "usage", "--by", "team", "--price-per-gpu-hour", "2")
    history = asyncio.run(read_history(story.cluster.nats_url, None))
    _, ledger = fold_attempts(history)
    nominals = {"lang": 4, "vision": 4}
    folded = usage(
        ledger.records(), "team", None, None, now=time.time(), price_per_gpu_hour=2.0, nominals=nominals
    )
    rows = {r["key"]: r for r in from_api["rows"]}
    assert rows == {r.key: json.loads(json.dumps(_builtins(r))) for r in folded.rows}
    # every attempt is charged: the preempted fillers' first attempts and the retried job's first
    assert rows["vision"]["attempts"] == 3 and rows["lang"]["attempts"] == 4
    assert rows["vision"]["nominal_gpus"] == 4 and rows["vision"]["quota_share"] == 0.5
    _projected(story)
    from_db = rally_json(
        capsys,
        "usage",
        "--by",
        "team",
        "--price-per-gpu-hour",
        "2",
        "--postgres-dsn",
        story.cluster.postgres_dsn,
    )
    assert {r["key"]: r["gpu_s"] for r in from_db["rows"]} == {k: r["gpu_s"] for k, r in rows.items()}
    assert from_db["total_gpu_s"] == from_api["total_gpu_s"]
    by_class = rally_json(capsys, "usage", "--by", "class")
    assert {r["key"] for r in by_class["rows"]} == {"best-effort", "production", "training-standard"}


def _builtins(row: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(row)


def test_logs_follow_streams_a_rank_until_it_ends(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    script = "for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done"
    job_id = submit(story.cluster.api_url, "talker", "lang", 1, ["sh", "-c", script])
    capsys.readouterr()
    assert main(["logs", job_id, "-f"]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("line")] == [
        f"line {i}" for i in range(1, 6)
    ]
    # A finished attempt's log, by attempt and rank, as JSON chunks. The first rank to exit 3 fails the
    # attempt and the agent stops the other, which on a loaded machine may not have echoed yet: the
    # failing rank's log holds the line, and every rank's log is complete (eof).
    texts = []
    for rank in ("0", "1"):
        argv = ("logs", story.retried, "--attempt", "1", "--rank", rank, "-o", "json")
        chunks = [json.loads(line) for line in _lines(capsys, *argv)]
        assert chunks[-1]["eof"] and {c["rank"] for c in chunks} == {int(rank)}
        texts.append("".join(c["text"] for c in chunks))
    assert any("failing" in text for text in texts)
    # Naming no rank shows the one whose exit failed the attempt, the rank `rally show` names too.
    (first, _) = rally_json(capsys, "show", story.retried)["attempts"]
    chunks = [
        json.loads(line) for line in _lines(capsys, "logs", story.retried, "--attempt", "1", "-o", "json")
    ]
    assert first["failed_rank"] in (0, 1) and {c["rank"] for c in chunks} == {first["failed_rank"]}
    assert {c["failed_rank"] for c in chunks} == {first["failed_rank"]}
    shown_text = "".join(c["text"] for c in chunks)
    assert "failing" in shown_text and shown_text == texts[first["failed_rank"]]
    capsys.readouterr()
    assert main(["logs", story.retried, "--attempt", "1"]) == 0
    printed = capsys.readouterr()
    assert printed.out == shown_text
    assert f"showing rank {first['failed_rank']}, whose exit failed attempt 1" in printed.err


def _lines(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


def test_queues_show_nominal_borrowed_used_pending(story: Story, capsys: pytest.CaptureFixture[str]) -> None:
    # Both vision's: the second waits for GPUs its own team holds. (A lang job would reclaim the 4 GPUs
    # vision borrowed from lang's share, evicting the blocker ~1 s after it starts: a read after that,
    # under load, found vision using nothing.) The second is submitted once the blocker runs, so it cannot
    # be placed ahead of it while an earlier test's job still holds a GPU for a moment.
    blocker = submit(story.cluster.api_url, "blocker", "vision", 8, ["sleep", "300"], priority="best-effort")
    waiting = blocker
    try:
        wait(story.cluster.api_url, blocker, {"running"})
        api = story.cluster.api_url
        waiting = submit(api, "waiting", "vision", 4, ["sleep", "1"], priority="best-effort")
        wait(story.cluster.api_url, waiting, {"pending"})
        answer = rally_json(capsys, "queues")
        teams = {t["team"]: t for t in answer["teams"]}
        assert answer["quotas"] is True
        assert (teams["vision"]["nominal"], teams["vision"]["used"], teams["vision"]["borrowed"]) == (4, 8, 4)
        assert (teams["vision"]["pending_jobs"], teams["vision"]["pending_gpus"]) == (1, 4)
        assert (teams["lang"]["used"], teams["lang"]["pending_jobs"]) == (0, 0)
        (cohort,) = answer["cohorts"]
        assert (cohort["cohort"], cohort["nominal"], cohort["used"]) == ("all", 8, 8)
        assert main(["queues"]) == 0
        assert "COHORT" in capsys.readouterr().out
    finally:
        for job_id in {blocker, waiting}:
            call("DELETE", f"{story.cluster.api_url}/v1/jobs/{job_id}")


# The tests below add jobs to the story: they come last, after the ones that count its jobs.


def test_every_read_command_takes_o_json_and_json_alike(
    story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    """One grammar (issue 31): `rally show J --json` and `rally jobs -o json` work, as every other pair."""
    reads = [
        ["jobs", "--all"],
        ["nodes"],
        ["show", story.done],
        ["history"],
        ["usage"],
        ["queues"],
        ["checkpoints", story.done],
    ]
    for argv in reads:
        as_o = rally_json(capsys, *argv)
        assert main([*argv, "--json"]) == 0, argv
        as_json = json.loads(capsys.readouterr().out)
        assert type(as_o) is type(as_json) and set(as_o) == set(as_json), argv


def test_a_closed_pipe_ends_quietly(story: Story) -> None:
    """`rally show J | head`, `rally nodes | head`, `rally jobs | head`, `rally submit --wait | head`: no
    BrokenPipeError traceback, whichever format. The reader is gone before the first byte, as when
    `head` has read its lines (a real `head` makes the failure come and go with the race)."""
    submit_wait = ["submit", "--gpus", "1", "--team", "lang", "--wait", "--", "true"]
    for argv in (["show", story.done], ["nodes"], ["jobs", "--all"], submit_wait):
        for fmt in ("table", "json"):
            done = _into_closed_pipe([*argv[:1], "-o", fmt, *argv[1:]])
            assert (done.returncode, done.stderr) == (141, ""), (argv, fmt, done.stderr)


def _into_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)
    try:
        rally = [sys.executable, "-m", "rallypoint.cli.main", *argv]
        return subprocess.run(rally, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)


def test_a_drain_says_what_it_will_do_and_the_attempt_reads_drained(
    story: Story, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31's drain row: a gang that checkpoints nothing is not interrupted at once (it may wait out
    the 30 min deadline), and the drain, `rally nodes` and `rally show` say so, with the deadline; a
    development gang goes at once, and its attempt reads drained, not attempt-failed."""
    api = story.cluster.api_url
    waits = submit(api, "no-ckpt", "lang", 4, ["sleep", "300"], priority="training-standard")
    goes = submit(api, "dev", "lang", 4, ["sleep", "300"], priority="development")
    for job_id in (waits, goes):
        wait(api, job_id, {"running"})
    node_of = {job_id: call("GET", f"{api}/v1/jobs/{job_id}")[1]["nodes"][0] for job_id in (waits, goes)}
    try:
        said = _lines(capsys, "nodes", "drain", node_of[waits], "--reason", "maintenance")
        assert said[0].startswith(f"node {node_of[waits]} drained (maintenance)"), said
        assert said[1].startswith(f"  {waits}: interrupted at ") and "no checkpoint committed yet" in said[1]
        nodes = {n["node_id"]: n for n in rally_json(capsys, "nodes")["nodes"]}
        [plan] = nodes[node_of[waits]]["draining_jobs"]
        assert (plan["job_id"], plan["plan"]) == (waits, "at-deadline")
        assert plan["deadline"] > time.time() + 25 * 60, "it leaves by the 30 min deadline, not now"
        row = next(r for r in _lines(capsys, "nodes") if r.startswith(node_of[waits]))
        assert "DRAINING" in row and f"{waits} at-deadline by" in row
        drain = next(r for r in _lines(capsys, "show", waits) if r.strip().startswith("Drain="))
        assert drain.strip().startswith(f"Drain={node_of[waits]} (maintenance): interrupted at ")
        assert rally_json(capsys, "show", waits)["drain"]["plan"] == "at-deadline"
        _lines(capsys, "nodes", "drain", node_of[goes], "--reason", "maintenance")
        deadline = time.monotonic() + 60
        while not (attempts := rally_json(capsys, "show", goes)["attempts"])[0]["ended_at"]:
            assert time.monotonic() < deadline, "the development gang was not interrupted at once"
            time.sleep(0.5)
        assert attempts[0]["outcome"] == "drained"
        assert call("GET", f"{api}/v1/jobs/{waits}")[1]["state"] == "running", "it still runs, as said"
    finally:
        for node in set(node_of.values()):
            _lines(capsys, "nodes", "undrain", node, "--reason", "done")
        for job_id in (waits, goes):
            call("DELETE", f"{api}/v1/jobs/{job_id}")
        for job_id in (waits, goes):
            wait(api, job_id, TERMINAL)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
