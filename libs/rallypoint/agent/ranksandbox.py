"""The rank's view of the file system: what it needs of the agent's folders, none of the rest.

A rank runs as an unprivileged user (``rankuser``), but it must still start the cluster's interpreter,
import the training client and reach its own attempt folder and checkpoint folder. Those may sit under a
folder that user cannot enter: ``/root`` (mode 700) holds the interpreter on a dev box, pytest's temporary
folders are 700, and the agent's own work dir is 700 on purpose (every job's task file and log is in it).

So the rank wrapper (root) gives the rank a mount namespace of its own before it drops privileges
(``enter``). For each such folder it cannot enter (a *cover*), it mounts a fresh tmpfs (mode 755) over it
and puts back, by bind mount, only the paths below it the rank needs: the rank sees ``/root/.pyenv`` and
nothing else of ``/root``, its own attempt folder and no other job's. The mounts are private: nothing of
it reaches the host or another rank.

The choice of paths and covers is pure (``rank_paths``, ``plan``) and unit-tested; the syscalls are thin.
``python -m rallypoint.agent.ranksandbox --user U --dir D`` is the probe the agent runs at start: it builds
the sandbox a rank in ``D`` would get, then starts the interpreter there as ``U`` and imports the wrapper.

Standard library only: the rank wrapper imports it, and should start fast.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from typing import NamedTuple

_CLONE_NEWNS = 0x00020000
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_BIND = 4096
_MS_MOVE = 8192
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2


class SandboxError(OSError):
    """The rank's mount namespace could not be built (no CAP_SYS_ADMIN, a mount refused)."""


class Cover(NamedTuple):
    """A folder the rank user cannot enter, hidden under a tmpfs, and the paths below it put back."""

    folder: str
    exposed: tuple[str, ...]


# -- the pure part --------------------------------------------------------------------------------


def may_enter(mode: int, owner: int, group: int, uid: int, gid: int) -> bool:
    """Whether ``uid`` (primary group ``gid``, no others: the wrapper clears them) may enter a folder."""
    if uid == 0:
        return True
    if owner == uid:
        return bool(mode & stat.S_IXUSR)
    if group == gid:
        return bool(mode & stat.S_IXGRP)
    return bool(mode & stat.S_IXOTH)


def outermost(paths: Iterable[str]) -> list[str]:
    """The paths, normalized, without those inside another one (putting a folder back brings its insides)."""
    kept: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths}):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def first_blocked(path: str, can_enter: Callable[[str], bool]) -> str | None:
    """The outermost ancestor of ``path`` the rank user cannot enter; None when it can reach ``path``."""
    for ancestor in reversed(PurePosixPath(path).parents):
        if str(ancestor) != "/" and not can_enter(str(ancestor)):
            return str(ancestor)
    return None


def plan(paths: Iterable[str], can_enter: Callable[[str], bool]) -> tuple[Cover, ...]:
    """The covers that make every one of ``paths`` reachable; paths already reachable need none. Covers
    never nest: each is the outermost blocked ancestor of its paths. A blocked folder *inside* an exposed
    path is not handled: the paths a rank needs (``rank_paths``) have none."""
    covers: dict[str, list[str]] = {}
    for path in {os.path.normpath(p) for p in paths}:
        blocked = first_blocked(path, can_enter)
        if blocked is not None:
            covers.setdefault(blocked, []).append(path)
    return tuple(Cover(folder, tuple(outermost(exposed))) for folder, exposed in sorted(covers.items()))


def deepest_existing(path: str, exists: Callable[[str], bool] = os.path.isdir) -> str:
    """``path`` or its nearest existing ancestor (a checkpoint folder the rank creates on first save)."""
    current = PurePosixPath(path)
    while str(current) != "/" and not exists(str(current)):
        current = current.parent
    return str(current)


def rank_paths(attempt_dir: str, checkpoint_dir: str | None, shared: Iterable[str] = ()) -> list[str]:
    """What a rank must reach: this interpreter (its real file, its installation, the venv), the package
    of the wrapper and training client, its attempt folder (its report file), its checkpoint folder and
    the folders the operator shares with every rank (``shared``: datasets, a scratch space)."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    paths = [
        os.path.dirname(os.path.realpath(sys.executable)),
        sys.base_prefix,
        sys.prefix,
        package_root,
        attempt_dir,
        *(folder for folder in shared if os.path.isdir(folder)),  # one not there yet hides nothing
    ]
    if checkpoint_dir:
        paths.append(deepest_existing(checkpoint_dir))
    return [os.path.realpath(p) for p in paths]


def enterable_by(uid: int, gid: int) -> Callable[[str], bool]:
    def can_enter(folder: str) -> bool:
        try:
            info = os.stat(folder)
        except OSError:
            return False
        return may_enter(info.st_mode, info.st_uid, info.st_gid, uid, gid)

    return can_enter


# -- the syscalls ---------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SandboxError(errno, f"{what}: {os.strerror(errno)}")


def _bytes(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


def _mount(
    libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    result = libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data))
    _check(result, f"mount {source or ''} on {target}")


def apply(covers: tuple[Cover, ...]) -> None:
    """Build the covers in a new, private mount namespace of this process (root, single-threaded)."""
    if not covers:
        return
    libc = _libc()
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Private first: nothing mounted from here on may propagate to the host's namespace.
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
    stage = f"/tmp/.rally-sandbox-{os.getpid()}"
    os.mkdir(stage, 0o700)
    try:
        _mount(libc, "tmpfs", stage, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=700")
        staged = _stage(libc, covers, stage)
        for cover in covers:
            _mount(libc, "tmpfs", cover.folder, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755")
        old_umask = os.umask(0o022)
        try:
            for spot, path in staged:
                os.makedirs(path, exist_ok=True)
                _mount(libc, spot, path, None, _MS_MOVE, None)
        finally:
            os.umask(old_umask)
        _check(libc.umount2(stage.encode(), _MNT_DETACH), f"umount {stage}")
    finally:
        with contextlib.suppress(OSError):  # still mounted after a failure: the namespace dies with us
            os.rmdir(stage)


def _stage(libc: ctypes.CDLL, covers: tuple[Cover, ...], stage: str) -> list[tuple[str, str]]:
    """Bind every exposed path to a spot of the staging tmpfs, before the covers hide them."""
    staged: list[tuple[str, str]] = []
    for path in (p for cover in covers for p in cover.exposed):
        spot = os.path.join(stage, str(len(staged)))
        os.mkdir(spot)
        _mount(libc, path, spot, None, _MS_BIND | _MS_REC, None)
        staged.append((spot, path))
    return staged


def enter(
    uid: int, gid: int, attempt_dir: str, checkpoint_dir: str | None, shared: Iterable[str] = ()
) -> tuple[Cover, ...]:
    """Give this process (and so the rank it starts) a view where ``uid`` reaches what a rank needs."""
    covers = plan(rank_paths(attempt_dir, checkpoint_dir, shared), enterable_by(uid, gid))
    apply(covers)
    return covers


# -- the probe ------------------------------------------------------------------------------------

PROBE = "import os, sys, rallypoint.agent.rankwrap; sys.exit(0 if os.access('.', os.R_OK | os.X_OK) else 3)"


def probe(user: str, folder: str) -> int:
    """Build a rank's sandbox for ``folder``, then start this interpreter there as ``user`` and import the
    rank wrapper, as a rank's start would. Its exit code: 0 when a rank can run."""
    import pwd

    entry = pwd.getpwnam(user)
    try:
        enter(entry.pw_uid, entry.pw_gid, folder, None)
    except OSError as exc:
        print(f"no sandbox for ranks: {exc}", file=sys.stderr)
        return 4
    started = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=folder,
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/"},
        check=False,
    )
    return started.returncode


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="ranksandbox", description="Probe: can ranks run as USER in DIR?")
    parser.add_argument("--user", required=True)
    parser.add_argument("--dir", required=True, help="a folder standing for a rank's attempt folder")
    args = parser.parse_args(argv)
    return probe(args.user, os.path.realpath(args.dir))


if __name__ == "__main__":
    sys.exit(main())
