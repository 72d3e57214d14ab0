"""Which OS user ranks run as: never root when an unprivileged one can run them.

A rank runs whatever command a job asked for. When the agent runs as root, as it does on a dev box or in
a privileged container, the rank wrapper drops the rank to an unprivileged user (``rankwrap --user``).
The wrapper itself stays root, so it can still write the exit record and signal the rank's group. The
local cluster picks ``$RALLY_RANK_USER`` or ``nobody``, but only when that user can start the cluster's
Python and enter its work folder (``usable_rank_user``). Otherwise every rank would fail to start: for
example, an interpreter under ``/root`` (mode 700) that ``nobody`` cannot execute. In that case the ranks
stay root and the reason is logged.
"""

from __future__ import annotations

import logging
import os
import pwd
import subprocess
import sys
from pathlib import Path

_log = logging.getLogger(__name__)

RANK_USER_ENV = "RALLY_RANK_USER"
DEFAULT_RANK_USER = "nobody"


def drop_to(user: str) -> tuple[int, int, dict[str, str]]:
    """(uid, gid, environment overrides) for running as ``user``; KeyError when there is no such user."""
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid, {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name}


def give_to(path: Path, user: str) -> None:
    """Make ``path`` (a folder, created if needed) the rank user's, so ranks can write in it."""
    uid, gid, _ = drop_to(user)
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)


def usable_rank_user(work_dir: Path, *, python: str = sys.executable) -> str | None:
    """The user ranks should run as; None: as this process's user (not root, or no usable other)."""
    if os.geteuid() != 0:
        return None  # already unprivileged: nothing to drop
    user = os.environ.get(RANK_USER_ENV) or DEFAULT_RANK_USER
    try:
        uid, gid, env = drop_to(user)
    except KeyError:
        _log.warning("no user %r on this host: ranks run as root", user)
        return None
    try:
        # What a rank of the local cluster does first: start the interpreter, in the work folder, and
        # reach the folders under it (the checkpoint root is then handed to the user).
        reach = "import os, sys; sys.exit(0 if os.access(sys.argv[1], os.X_OK) else 3)"
        probe = subprocess.run(
            [python, "-c", reach, str(work_dir)],
            cwd=work_dir,
            user=uid,
            group=gid,
            extra_groups=[],
            env={**os.environ, **env},
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        _log.warning("user %r cannot run ranks here (%s): ranks run as root", user, exc)
        return None
    if probe.returncode != 0:
        reason = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or [
            f"exit {probe.returncode}"
        ]
        _log.warning("user %r cannot run %s in %s (%s): ranks run as root", user, python, work_dir, reason[0])
        return None
    return user
