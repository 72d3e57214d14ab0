"""Which OS user ranks run as: an unprivileged one, distinct from the agent's, or none at all.

A rank runs whatever command a job asked for, so it must hold nothing of the agent: not its environment
(``rank_environment`` is an allow-list), not its user. When the agent runs as root, as it does on a dev box
or in a privileged container, the rank wrapper drops the rank to an unprivileged user (``rankwrap --user``)
inside a mount namespace that lets that user reach the interpreter and the rank's own folders
(``ranksandbox``). The wrapper itself stays root, so it can still write the exit record and signal the
rank's group. The user is ``$RALLY_RANK_USER`` or ``nobody``: its group and home, with a uid of the job's
own (``job_uid``), so the ranks of two jobs never share a uid. The agent probes at start that it can really
run a rank (``rank_user_problem``: the sandbox is built, the interpreter starts as that user and imports
the wrapper).

When it cannot (no such user, no CAP_SYS_ADMIN for the sandbox, an agent that is not root and so cannot
switch users), ranks would run with the agent's own identity and could read its credentials: the agent
refuses to start unless its operator allowed exactly that (``--allow-root-ranks``), and then says so in a
WARNING (``resolve_rank_user``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

_log = logging.getLogger(__name__)

RANK_USER_ENV = "RALLY_RANK_USER"
DEFAULT_RANK_USER = "nobody"
ALLOW_FLAG = "--allow-root-ranks"


class RankUserRefused(RuntimeError):
    """Ranks cannot run as an unprivileged user here and the operator did not allow the agent's own."""


def requested_rank_user() -> str:
    """The user ranks should run as: ``$RALLY_RANK_USER``, else ``nobody``."""
    return os.environ.get(RANK_USER_ENV) or DEFAULT_RANK_USER


#: Ranks of different jobs run as different uids (``job_uid``), so one job cannot read another's
#: /proc/<pid>/environ (its secrets), signal its ranks or touch its files, even on the same node.
JOB_UID_BASE = 1 << 30  # far above any uid a distribution or a directory service hands out
JOB_UID_SPAN = 1 << 24


def job_uid(job_id: str) -> int:
    """The uid a job's ranks run as: the same on every node and attempt, so a shared checkpoint folder
    keeps one owner. 2**24 of them: two jobs share one only by a hash collision (about 3 in 10,000 for
    100 jobs on one node)."""
    digest = hashlib.sha256(job_id.encode()).digest()
    return JOB_UID_BASE + int.from_bytes(digest[:4], "big") % JOB_UID_SPAN


def job_identity(user: str, job_id: str | None) -> tuple[int, int, dict[str, str]]:
    """(uid, gid, environment) of a job's ranks: ``user``'s group, home and names with the job's own uid
    (``user``'s uid when there is no job id); KeyError when there is no such user."""
    uid, gid, env = drop_to(user)
    return (job_uid(job_id) if job_id else uid), gid, env


def drop_to(user: str) -> tuple[int, int, dict[str, str]]:
    """(uid, gid, environment overrides) for running as ``user``; KeyError when there is no such user."""
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid, {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}


def give_to(path: Path, user: str) -> None:
    """Make ``path`` (a folder, created if needed) the rank user's and let every job's ranks write in it:
    mode 1777, whose sticky bit keeps one job from removing or renaming what another created there."""
    uid, gid, _ = drop_to(user)
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    path.chmod(0o1777)


def own_user() -> str:
    """This process's user, by name when it has one (what ranks run as without a drop)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def rank_user_problem(user: str, work_dir: Path, *, python: str = sys.executable) -> str | None:
    """Why ranks cannot run as ``user`` under ``work_dir``; None when they can (probed for real)."""
    if os.geteuid() != 0:
        return f"the agent runs as {own_user()}, not root: it cannot start ranks as another user"
    try:
        uid, _, _ = drop_to(user)
    except KeyError:
        return f"no user {user!r} on this host"
    if uid == 0:
        return f"user {user!r} is root"
    return _probe(user, work_dir, python)


def _probe(user: str, work_dir: Path, python: str) -> str | None:
    """Start what a rank starts, in a folder placed as an attempt's, as ``user`` in its sandbox."""
    folder = work_dir / ".rank-probe" / "0"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        probe = subprocess.run(
            [python, "-m", "rallypoint.agent.ranksandbox", "--user", user, "--dir", str(folder)],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the probe did not run: {exc}"
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)
    if probe.returncode == 0:
        return None
    lines = probe.stderr.decode(errors="replace").strip().splitlines()
    why = lines[-1] if lines else f"exit {probe.returncode}"
    return f"{python} did not start as {user!r} in {work_dir}: {why}"


def resolve_rank_user(
    user: str, work_dir: Path, *, allow_own_user: bool, python: str = sys.executable
) -> str | None:
    """The user ranks run as (None: the agent's own, allowed by its operator); RankUserRefused when
    ``user`` cannot run them and the agent's own user was not allowed."""
    problem = rank_user_problem(user, work_dir, python=python)
    if problem is None:
        _log.info("ranks run as %s, in a sandbox of their own", user)
        return user
    if not allow_own_user:
        raise RankUserRefused(
            f"ranks cannot run as {user!r} ({problem}); refusing to run them as {own_user()}, whose "
            f"credentials they could read. Fix that, set {RANK_USER_ENV}, or pass {ALLOW_FLAG}"
        )
    _log.warning(
        "RANKS RUN AS %s, THE AGENT'S OWN USER (%s): every job can read this agent's credentials (%s)",
        own_user().upper(), problem, ALLOW_FLAG,
    )  # fmt: skip
    return None
