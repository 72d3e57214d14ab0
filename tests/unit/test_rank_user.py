"""Ranks never run as root when an unprivileged user can run them (issue 18, item 1; issue 30, item 1)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from rallypoint.agent import RankExit, RankLauncher, workdir
from rallypoint.agent.rankuser import give_to, job_uid, rank_user_problem
from rallypoint.protocol import LaunchTask, RankSpec


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


NOBODY = _nobody()
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or NOBODY is None, reason="dropping privileges needs root and a 'nobody' user"
)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder another user may enter (pytest's own tmp folders are 0700 under root)."""
    path = Path(tempfile.mkdtemp(prefix="rally-rankuser-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _task(command: list[str], job_id: str = "j-user") -> LaunchTask:
    return LaunchTask(
        job_id=job_id,
        attempt=0,
        node_id="node-1",
        node_rank=0,
        world_size=1,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=23456,
        ranks=(RankSpec(rank=0, local_rank=0, gpus=(0,)),),
        command=tuple(command),
        env={},
    )


def _wait_exit(launcher: RankLauncher, timeout: float = 15.0, job_id: str | None = None) -> RankExit:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exits = [e for e in launcher.poll() if job_id is None or e.job_id == job_id]
        if exits:
            return exits[0]
        time.sleep(0.05)
    raise AssertionError("the rank did not exit")


@needs_root
def test_rank_runs_as_the_unprivileged_user_and_owns_its_report_file(open_dir: Path) -> None:
    assert NOBODY is not None
    launcher = RankLauncher(open_dir / "agent", run_as="nobody")
    launcher.launch(_task(["/bin/sh", "-c", 'id -u; echo "$HOME"; echo report >> "$RALLY_REPORT_FILE"']))
    exit = _wait_exit(launcher)
    assert exit.exit_code == 0
    out = launcher.log_path("j-user", 0, 0).read_text().split()
    # nobody's home and group, with a uid of the job's own
    assert out[:2] == [str(job_uid("j-user")), NOBODY.pw_dir] and job_uid("j-user") != NOBODY.pw_uid
    report = next((open_dir / "agent" / "j-user" / "0").glob("rank-0.report*"))
    assert report.stat().st_uid == job_uid("j-user") and "report" in report.read_text()
    # The wrapper kept root: its exit record is there, written by root.
    assert next((open_dir / "agent" / "j-user" / "0").glob("rank-0.exit")).stat().st_uid == 0


@needs_root
def test_the_ranks_of_two_jobs_cannot_read_each_others_environment(open_dir: Path) -> None:
    launcher = RankLauncher(open_dir / "agent", run_as="nobody")
    victim = _task(["sleep", "60"], job_id="j-victim")
    launcher.launch(msgspec.structs.replace(victim, env={"WANDB_API_KEY": "s3cret"}))
    pid_file = workdir.rank_file(open_dir / "agent" / "j-victim" / "0", 0, "pid")
    deadline = time.monotonic() + 15
    while (record := workdir.read_record(pid_file)) is None:
        assert time.monotonic() < deadline, "the victim's rank never started"
        time.sleep(0.05)
    try:
        environ = f"/proc/{record['pid']}/environ"
        thief_task = _task(["sh", "-c", f"id -u; cat {environ}"], job_id="j-thief")
        other_gpu = (RankSpec(rank=0, local_rank=0, gpus=(1,)),)  # the victim's GPU is taken
        launcher.launch(msgspec.structs.replace(thief_task, ranks=other_gpu))
        thief = _wait_exit(launcher, job_id="j-thief")
        out = launcher.log_path("j-thief", 0, 0).read_text()
        assert thief.exit_code != 0 and "s3cret" not in out and "Permission denied" in out, out
        assert out.split()[0] == str(job_uid("j-thief")) != str(job_uid("j-victim"))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record["pid"], signal.SIGKILL)


@needs_root
def test_without_run_as_the_rank_keeps_the_agents_user(open_dir: Path) -> None:
    launcher = RankLauncher(open_dir / "agent")
    launcher.launch(_task(["id", "-u"]))
    assert _wait_exit(launcher).exit_code == 0
    assert launcher.log_path("j-user", 0, 0).read_text().split()[0] == "0"


@needs_root
def test_the_sandbox_lets_the_user_run_ranks_under_folders_it_cannot_enter(tmp_path: Path) -> None:
    # pytest's tmp_path is 0700 root and the interpreter may sit under /root (0700): the probe's sandbox
    # puts back what a rank needs of them
    assert rank_user_problem("nobody", tmp_path) is None
    assert "no user 'no-such-rank-user'" in (rank_user_problem("no-such-rank-user", tmp_path) or "")
    assert "is root" in (rank_user_problem("root", tmp_path) or "")


@needs_root
def test_give_to_hands_a_folder_to_the_user(open_dir: Path) -> None:
    assert NOBODY is not None
    give_to(open_dir / "checkpoints", "nobody")
    assert (open_dir / "checkpoints").stat().st_uid == NOBODY.pw_uid


def test_an_agent_that_is_not_root_cannot_run_ranks_as_another_user(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "not root" in (rank_user_problem("nobody", tmp_path) or "")
