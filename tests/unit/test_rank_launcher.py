"""The rank launcher with real processes: environment, exit codes, kill, idempotency, re-adoption."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.agent import EXIT_LOST, RankExit, RankLauncher
from rallypoint.agent.reaper import zombie_children
from rallypoint.agent.workdir import read_record
from rallypoint.jobs import validate as limits
from rallypoint.jobs import validate_spec
from rallypoint.protocol import LaunchTask, RankSpec

PY = sys.executable

# The child dumps the contract variables it sees, then exits with the code the test asked for.
DUMP_ENV = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR",
        "MASTER_PORT", "NODE_RANK", "RALLY_JOB_ID", "RALLY_ATTEMPT", "USER_VAR", "INHERITED",
        "CUDA_DEVICE_ORDER", "RALLY_REPORT_FILE"]
out = os.path.join(sys.argv[1], f"env-{os.environ['RANK']}.json")
with open(out, "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
print("hello from rank", os.environ["RANK"], flush=True)
sys.exit(int(os.environ["RANK"]) % 2)
"""

# Runs until a file appears, then exits with the code in it.
WAIT_FOR_FILE = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
sys.exit(int(open(sys.argv[1]).read()))
"""


def release(go: Path, exit_code: int) -> None:
    """Tell WAIT_FOR_FILE ranks to exit: written whole then renamed, so a rank never reads it half-written."""
    partial = go.with_suffix(".partial")
    partial.write_text(str(exit_code))
    partial.replace(go)


IGNORE_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
    "time.sleep(60)"
)


def make_task(
    job_id: str,
    command: list[str],
    *,
    ranks: int = 2,
    attempt: int = 0,
    env: dict[str, str] | None = None,
    first_gpu: int = 0,
) -> LaunchTask:
    """Two GPUs a rank from ``first_gpu`` on: tasks running side by side need GPUs of their own (a rank
    of another attempt on a GPU a launch gets is stale, and killed first)."""
    return LaunchTask(
        job_id=job_id,
        attempt=attempt,
        node_id="node-1",
        node_rank=1,
        world_size=2 * ranks,
        local_world_size=ranks,
        master_addr="10.0.0.7",
        master_port=23456,
        ranks=tuple(
            RankSpec(rank=ranks + r, local_rank=r, gpus=(first_gpu + 2 * r, first_gpu + 2 * r + 1))
            for r in range(ranks)
        ),
        command=tuple(command),
        env=env or {},
    )


def wait_exits(launcher: RankLauncher, count: int, timeout: float = 10.0) -> list[RankExit]:
    exits: list[RankExit] = []
    deadline = time.monotonic() + timeout
    while len(exits) < count:
        assert time.monotonic() < deadline, f"only {len(exits)} of {count} ranks exited: {exits}"
        exits += launcher.poll()
        time.sleep(0.02)
    return sorted(exits, key=lambda e: e.rank)


def wait_for(check: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """The work dir; afterwards every rank and wrapper still alive under it is SIGKILLed."""
    work_dir = tmp_path / "work"
    yield work_dir
    for pid_file in work_dir.rglob("rank-*.pid"):
        record = read_record(pid_file) or {}
        with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
            os.killpg(record.get("pid"), signal.SIGKILL)  # type: ignore[arg-type]
        with contextlib.suppress(ProcessLookupError, PermissionError, TypeError):
            os.kill(record.get("wrapper_pid"), signal.SIGKILL)  # type: ignore[arg-type]


def test_ranks_get_the_contract_environment_logs_and_exit_codes(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INHERITED", "from-agent")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    launcher = RankLauncher(work)
    task = make_task("job-a", [PY, "-c", DUMP_ENV, str(tmp_path)], env={"USER_VAR": "x"})
    outcome = launcher.launch(task)
    assert outcome.started == (2, 3) and not outcome.already_running
    exits = wait_exits(launcher, 2)
    assert [(e.job_id, e.attempt, e.rank, e.exit_code) for e in exits] == [
        ("job-a", 0, 2, 0),
        ("job-a", 0, 3, 1),
    ]
    assert all(abs(e.at - time.time()) < 30 for e in exits)
    env2 = json.loads((tmp_path / "env-2.json").read_text())
    env3 = json.loads((tmp_path / "env-3.json").read_text())
    assert env2 == {
        "RANK": "2",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "23456",
        "NODE_RANK": "1",
        "RALLY_JOB_ID": "job-a",
        "RALLY_ATTEMPT": "0",
        "USER_VAR": "x",
        "INHERITED": None,  # nothing of the agent's environment but its allow-list (issue 30)
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "RALLY_REPORT_FILE": str(work.absolute() / "job-a" / "0" / "rank-2.report"),
    }
    assert env3["RANK"] == "3" and env3["LOCAL_RANK"] == "1" and env3["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env3["RALLY_REPORT_FILE"] == str(work.absolute() / "job-a" / "0" / "rank-3.report")
    log = launcher.log_path("job-a", 0, 3)
    assert log == work / "job-a" / "0" / "rank-3.log"
    assert "hello from rank 3" in log.read_text()
    assert launcher.poll() == []  # each exit is handed out once
    assert {(s.rank, s.exit_code) for s in launcher.status()} == {(2, 0), (3, 1)}


def test_launch_is_idempotent_across_launcher_instances(work: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    task = make_task("job-b", [PY, "-c", WAIT_FOR_FILE, str(go)])
    first = RankLauncher(work)
    assert first.launch(task).started == (2, 3)
    again = first.launch(task)
    assert again.already_running and again.already == (2, 3)
    # A restarted agent receiving the resent command must not start the ranks a second time either.
    second = RankLauncher(work)
    assert second.launch(task).already_running
    release(go, 0)
    assert [e.exit_code for e in wait_exits(first, 2)] == [0, 0]
    # Exactly one wrapper ran each rank: one pid file, one start line in the log at most.
    assert len(list((work / "job-b" / "0").glob("rank-*.pid"))) == 2


def test_kill_sigterm_then_sigkill_after_grace(work: Path, tmp_path: Path) -> None:
    launcher = RankLauncher(work)
    launcher.launch(make_task("job-c", [PY, "-c", "import time; time.sleep(60)"], ranks=1))
    stubborn = make_task("job-d", [PY, "-c", IGNORE_TERM], ranks=1, first_gpu=2)
    launcher.launch(stubborn)
    wait_for(lambda: "up" in launcher.log_path("job-d", 0, 1).read_text())
    assert launcher.kill("job-c", 0, grace_s=5.0) == 1
    assert launcher.kill("job-d", 0, grace_s=0.3) == 1
    assert launcher.kill("job-zzz", 0) == 0
    exits = {e.job_id: e.exit_code for e in wait_exits(launcher, 2)}
    assert exits == {"job-c": 128 + signal.SIGTERM, "job-d": 128 + signal.SIGKILL}
    assert launcher.kill("job-c", 0) == 0  # nothing left to stop


def test_a_stale_rank_on_a_gpu_the_log_gave_away_is_killed_before_the_new_rank_starts(
    work: Path, tmp_path: Path
) -> None:
    launcher = RankLauncher(work)
    # attempt 1 of a gang, its node cut off meanwhile: the log moved the gang on, its rank here runs on,
    # deaf to SIGTERM
    launcher.launch(make_task("old", [PY, "-c", IGNORE_TERM], ranks=2, attempt=1))
    wait_for(lambda: all("up" in launcher.log_path("old", 1, r).read_text() for r in (2, 3)))
    side = make_task("side", [PY, "-c", "import time; time.sleep(60)"], ranks=1, first_gpu=6)
    launcher.launch(side)
    # the node is back and the log gives GPU 3 (rank 3's) to another job: that whole stale attempt goes
    newcomer = make_task("new", [PY, "-c", "print('started', flush=True)"], ranks=1, first_gpu=3)
    outcome = launcher.launch(newcomer)
    assert outcome.evicted == (("old", 1),) and outcome.started == (1,)
    # killed (no grace: SIGTERM is ignored) and its exits recorded before the new rank was spawned
    old_exits = {(e.rank, e.exit_code) for e in launcher.poll() if e.job_id == "old"}
    assert old_exits == {(2, 128 + signal.SIGKILL), (3, 128 + signal.SIGKILL)}
    # a rank on other GPUs is left alone, and a resent launch of the new task evicts nothing
    assert {s.job_id: s.exit_code for s in launcher.status()}["side"] is None
    assert launcher.launch(newcomer).evicted == ()
    launcher.kill("side", 0, grace_s=0.0)


def test_a_launch_of_an_attempt_older_than_one_running_starts_nothing_and_kills_nothing(work: Path) -> None:
    launcher = RankLauncher(work)
    launcher.launch(make_task("gang", [PY, "-c", "import time; time.sleep(60)"], ranks=1, attempt=2))
    late = launcher.launch(make_task("gang", [PY, "-c", "pass"], ranks=1, attempt=1))
    assert (late.superseded_by, late.started, late.evicted) == (2, (), ())
    assert [(s.attempt, s.exit_code) for s in launcher.status()] == [(2, None)]
    launcher.kill("gang", 2, grace_s=0.0)


def test_readoption_after_the_launcher_is_discarded(work: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    old = RankLauncher(work)
    old.launch(make_task("job-e", [PY, "-c", WAIT_FOR_FILE, str(go)]))
    quick = make_task("job-f", [PY, "-c", "raise SystemExit(3)"], ranks=1, first_gpu=4)
    old.launch(quick)
    # every rank the new launcher is asked about must have been started (each wrapper writes its own pid)
    wait_for(lambda: all((work / "job-e" / "0" / f"rank-{r}.pid").exists() for r in (2, 3)))
    wait_for(lambda: (work / "job-f" / "0" / "rank-1.exit").exists())
    old.forget_processes()  # the agent "crashes": no poll, no reaping, no reports

    new = RankLauncher(work)
    running = {(s.job_id, s.rank): s for s in new.status()}
    assert running[("job-e", 2)].exit_code is None and running[("job-e", 2)].pid > 0
    # The exit that happened while nobody watched is reported by the new launcher.
    assert [(e.job_id, e.exit_code) for e in new.poll()] == [("job-f", 3)]
    release(go, 5)
    exits = wait_exits(new, 2)
    assert [(e.rank, e.exit_code) for e in exits] == [(2, 5), (3, 5)]
    for exit in exits:
        new.mark_reported(exit)
    # job-f was handed out but never confirmed in the log: a third start must report it again.
    third = RankLauncher(work)
    assert [(e.job_id, e.rank) for e in third.poll()] == [("job-f", 1)]
    assert len(third.unreported()) == 1


def test_kill_survives_a_launcher_restart(work: Path) -> None:
    old = RankLauncher(work)
    old.launch(make_task("job-g", [PY, "-c", IGNORE_TERM], ranks=1))
    wait_for(lambda: "up" in old.log_path("job-g", 0, 1).read_text())
    assert old.kill("job-g", 0, grace_s=0.5) == 1  # SIGTERM sent and ignored
    old.forget_processes()  # the agent crashes mid-grace
    new = RankLauncher(work)  # knows the kill deadline from disk and escalates
    assert [e.exit_code for e in wait_exits(new, 1)] == [128 + signal.SIGKILL]


def test_lost_wrapper_is_reported_and_its_rank_does_not_run_on(work: Path, tmp_path: Path) -> None:
    launcher = RankLauncher(work)
    launcher.launch(make_task("job-h", [PY, "-c", "import time; time.sleep(60)"], ranks=1))
    pid_file = work / "job-h" / "0" / "rank-1.pid"
    wait_for(pid_file.exists)
    record = read_record(pid_file)
    assert record is not None
    os.kill(record["wrapper_pid"], signal.SIGKILL)
    [exit] = wait_exits(launcher, 1)
    assert exit.exit_code == EXIT_LOST
    # The rank died with its wrapper (parent-death signal), so nothing unaccounted for holds the GPUs.
    wait_for(
        lambda: (
            not Path(f"/proc/{record['pid']}").exists()
            or Path(f"/proc/{record['pid']}/stat").read_text().split(")")[-1].split()[0] == "Z"
        )
    )


def test_command_not_found(work: Path) -> None:
    launcher = RankLauncher(work)
    launcher.launch(make_task("job-i", ["/nonexistent/train"], ranks=1))
    [exit] = wait_exits(launcher, 1)
    assert exit.exit_code == 127
    assert "cannot start rank" in launcher.log_path("job-i", 0, 1).read_text()


def test_a_rank_whose_wrapper_cannot_exec_exits_126_with_the_reason_in_its_log(work: Path) -> None:
    # 200 KiB in one variable is over Linux's 128 KiB per string: exec fails with E2BIG (Issue 18).
    launcher = RankLauncher(work)
    outcome = launcher.launch(make_task("job-big", [PY, "-c", "pass"], ranks=1, env={"BIG": "x" * 200_000}))
    assert outcome.started == (1,)
    [exit] = wait_exits(launcher, 1)
    assert exit.exit_code == 126
    assert "Argument list too long" in launcher.log_path("job-big", 0, 1).read_text()


def test_a_spec_at_every_api_limit_at_once_still_execs(work: Path) -> None:
    """The API's limits (validate.py) keep every spec it accepts under the kernel's exec limits: the
    biggest command and environment it lets through together, plus the agent's own, start a rank."""
    one = limits.MAX_ARG_BYTES
    command = [PY, "-c", "pass", *["y" * one] * (limits.MAX_COMMAND_BYTES // (one + 3) - 1)]
    env = {f"BIG_{i}": "x" * one for i in range(limits.MAX_ENV_BYTES // (one + 12))}
    spec = validate_spec({"name": "big", "team": "nlp", "gpus": 1, "command": command, "env": env})
    launcher = RankLauncher(work)
    launcher.launch(make_task("job-max", list(spec.command), ranks=1, env=dict(spec.env)))
    [exit] = wait_exits(launcher, 1)
    assert exit.exit_code == 0, launcher.log_path("job-max", 0, 1).read_text()[-500:]


def test_wrapper_honours_a_kill_that_came_before_it_started(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "rank-0.kill").write_text(json.dumps({"requested_at": 0, "grace_s": 5}))
    done = subprocess.run(
        [
            PY,
            "-m",
            "rallypoint.agent.rankwrap",
            "--dir",
            str(tmp_path),
            "--rank",
            "0",
            "--",
            PY,
            "-c",
            f"open({str(marker)!r}, 'w')",
        ],
        timeout=30,
        check=False,
    )
    assert done.returncode == 0
    assert read_record(tmp_path / "rank-0.exit")["exit_code"] == 128 + signal.SIGTERM  # type: ignore[index]
    assert not marker.exists()


def test_unsafe_job_ids_are_refused(work: Path) -> None:
    launcher = RankLauncher(work)
    with pytest.raises(ValueError):
        launcher.launch(make_task("../escape", [PY, "-c", "pass"], ranks=1))


# -- reaping (issue 15: defunct processes piling up under the agent) ----------------------------------


def run_short_ranks(launcher: RankLauncher, jobs: int, ranks: int, wave: int = 10) -> list[RankExit]:
    """``jobs`` tasks of ``ranks`` ranks that exit at once, ``wave`` tasks at a time (2 shared cores),
    polled quickly the way an agent does: each exit file is seen just as its wrapper is exiting."""
    exits: list[RankExit] = []
    for first in range(0, jobs, wave):
        batch = range(first, min(first + wave, jobs))
        for j in batch:
            launcher.launch(make_task(f"short-{j}", ["true"], ranks=ranks, first_gpu=2 * ranks * (j - first)))
        exits += wait_exits(launcher, len(batch) * ranks, timeout=60.0)
        for exit in exits[-len(batch) * ranks :]:
            launcher.mark_reported(exit)
    return exits


def test_a_hundred_short_ranks_leave_no_zombie(work: Path) -> None:
    before = zombie_children()  # another test's leftovers are not this one's to count
    launcher = RankLauncher(work)
    # Three waves: a launcher that lets go of a wrapper once it has read its exit file (the bug this
    # guards) left 71 of these 100 ranks' wrappers as zombies, 25 of the first 40 (300 took 3x as long).
    exits = run_short_ranks(launcher, jobs=25, ranks=4)
    assert len(exits) == 100 and {e.exit_code for e in exits} == {0}
    # A wrapper writes its exit file just before it exits: the poll after that one reaps it.
    wait_for(lambda: launcher.poll() == [] and launcher.unreaped() == 0, timeout=10.0)
    assert zombie_children() - before == set()


def test_wrappers_of_a_discarded_launcher_are_reaped_by_the_next(work: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    before = zombie_children()
    old = RankLauncher(work)
    old.launch(make_task("job-z", [PY, "-c", WAIT_FOR_FILE, str(go)], ranks=3))
    old.launch(make_task("job-y", ["true"], ranks=3, first_gpu=6))
    wait_for(lambda: all((work / "job-z" / "0" / f"rank-{r}.pid").exists() for r in (3, 4, 5)))
    wait_for(lambda: len(list((work / "job-y" / "0").glob("rank-*.exit"))) == 3)
    old.forget_processes()  # an in-process agent restart: the wrappers are our children, unhandled
    new = RankLauncher(work)
    release(go, 0)
    assert len(wait_exits(new, 6)) == 6
    wait_for(lambda: new.poll() == [] and new.unreaped() == 0, timeout=10.0)
    assert zombie_children() - before == set()


# The rank starts a helper through a child that exits at once, so the helper is orphaned: it must be
# re-parented to the wrapper (a subreaper) and reaped by it when it dies, while the rank still runs.
ORPHAN_MAKER = """
import os, sys, time
out, go = sys.argv[1], sys.argv[2]
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(0.3)
        with open(out + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(out + ".tmp", out)
        time.sleep(0.5)
        os._exit(0)
    os._exit(0)
os.wait()
while not os.path.exists(go):
    time.sleep(0.02)
"""


def test_the_wrapper_reaps_what_its_rank_orphaned(work: Path, tmp_path: Path) -> None:
    helper_pid_file, go = tmp_path / "helper.pid", tmp_path / "go"
    launcher = RankLauncher(work)
    launcher.launch(make_task("job-o", [PY, "-c", ORPHAN_MAKER, str(helper_pid_file), str(go)], ranks=1))
    wait_for(helper_pid_file.exists)
    helper = int(helper_pid_file.read_text())
    record = read_record(work / "job-o" / "0" / "rank-1.pid")
    assert record is not None
    stat = Path(f"/proc/{helper}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(stat[1]) == record["wrapper_pid"]  # adopted by the wrapper, not by PID 1
    # gone entirely (reaped), not a zombie, while the rank and its wrapper still run
    wait_for(lambda: not Path(f"/proc/{helper}").exists(), timeout=10.0)
    assert zombie_children(record["wrapper_pid"]) == set()
    assert launcher.poll() == []
    release(go, 0)
    assert [e.exit_code for e in wait_exits(launcher, 1)] == [0]
