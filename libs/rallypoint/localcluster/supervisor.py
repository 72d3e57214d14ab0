"""A whole Rallypoint cluster on one machine: real servers, every service its own OS process.

Used by `rally up`, `rally demo` and the end-to-end tests, so what a newcomer runs is what the tests
prove. Each child is a :class:`ManagedProcess`: its own process group and a parent-death signal, so an
interrupted `rally up` leaves nothing behind. ``supervise()`` restarts whatever died, the servers included
(nats-server and PostgreSQL on their own port and data: the services reconnect by themselves), and every
service but the API serves ``/healthz`` and ``/readyz`` on a port of its own (``health_ports``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from rallypoint.agent import workdir
from rallypoint.agent.rankuser import give_to, requested_rank_user, resolve_rank_user
from rallypoint.infra import ManagedProcess, NatsServer, PostgresServer, ServerStartError, free_port
from rallypoint.infra.forkserver import ForkedProcess, ForkServer
from rallypoint.runtime.cohost import hosting_refusal
from rallypoint.scheduling.queues import load_queues
from rallypoint.security import ADMIN, agent_user
from rallypoint.security.credentials import LocalCredentials
from rallypoint.security.natsconf import literal, render_accounts

from . import default_queues
from .http import call, register_token
from .localtokens import keep_or_make_tokens
from .portcheck import Port, check_ports

_log = logging.getLogger("rallypoint.localcluster")
#: The checkout's examples (the demo's training job, the tests' gangs): in every rank's sandbox, so a
#: checkout under a private folder (a home, ``mktemp -d``) still lets an unprivileged rank read them.
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

# Services every cluster runs once, in start order. The scheduler runs twice: one leader, one standby.
SINGLETONS: tuple[str, ...] = (
    "inventory",
    "health-monitor",
    "preemption",
    "checkpoint",
    "job-controller",
    "projector",
    "predictor",
)
SCHEDULERS = ("scheduler-1", "scheduler-2")
#: Services that may run as several replicas sharing their work (``runtime.partitions``): ``replicas``.
PARTITIONED: frozenset[str] = frozenset({"job-controller", "health-monitor"})
#: Every service ``replicas`` may name (docs/deployment.md says what N of each buys): the partitioned
#: ones, the scheduler's standbys, and those whose replicas share queries or stand by.
REPLICATED: frozenset[str] = PARTITIONED | {"api", "scheduler", *SINGLETONS}


def _checked_colocation(colocate: Sequence[str], replicas: Mapping[str, int]) -> tuple[str, ...]:
    """The services to host together, checked (``hosting_refusal``), each with as many replicas (a host is
    one replica of each)."""
    services = tuple(colocate)
    if not services:
        return ()
    refusal = hosting_refusal(services)
    if refusal is not None:
        raise ValueError(f"colocate: {refusal}")
    counts = {service: replicas.get(service, 1) for service in services}
    if len(set(counts.values())) != 1:
        raise ValueError(f"colocated services run as many replicas each (a host is one of each): {counts}")
    return services


def instances(service: str, count: int) -> tuple[str, ...]:
    """The instance names of ``count`` replicas: the service's own name for one (what tools and tests
    name it by), ``<service>-1``, ``<service>-2``... for more. The API's first is always ``api`` (its
    port is the cluster's ``api_url``) and the scheduler's always numbered (a leader and standbys)."""
    if service == "api":
        return ("api", *(f"api-{i + 1}" for i in range(1, count)))
    if service == "scheduler":
        return tuple(f"scheduler-{i + 1}" for i in range(count))
    return (service,) if count == 1 else tuple(f"{service}-{i + 1}" for i in range(count))


# Teams that get an API token when the cluster has no queue file: the default queue file's (the demo's, the
# benchmarks', and two for trying things out by hand).
DEFAULT_TEAMS: tuple[str, ...] = default_queues.TEAMS
# Services that read the queue file, when the cluster has one.
QUEUE_READERS: frozenset[str] = frozenset({"api", "scheduler", "preemption"})
# Where the projector finds its PostgreSQL DSN (services/projector: --postgres-dsn's default).
POSTGRES_DSN_ENV = "RALLY_POSTGRES_DSN"

# The local cluster reacts faster than the production defaults, so a hung node's gang is back on a
# replacement within seconds: silent 3 s -> unreachable, 8 s -> lost (detection within 10 s); a failed
# attempt retried after 1 s, doubling.
LOCAL_SERVICE_ARGS: dict[str, tuple[str, ...]] = {
    "health-monitor": ("--unreachable-after", "3", "--lost-after", "8"),
    "job-controller": ("--retry-backoff", "1", "--max-backoff", "30"),
    "scheduler": ("--repair-wait", "30"),
}


def local_service_seconds(service: str, flag: str) -> float:
    """The seconds ``flag`` gives ``service`` in the local cluster (``LOCAL_SERVICE_ARGS``): what a bench
    or an audit of a local cluster's log must assume, e.g. the scheduler's ``--repair-wait``."""
    args = LOCAL_SERVICE_ARGS[service]
    return float(args[args.index(flag) + 1])


def _revive(name: str, server: NatsServer | PostgresServer) -> bool:
    """Restart ``server`` if it died; True if it did and is back."""
    if server.running():
        return False
    _log.warning("%s (pid %s) died; restarting it on port %d", name, server.pid, server.port)
    try:
        server.restart()
    except ServerStartError as exc:
        _log.error("%s did not come back (tried again next time): %s", name, exc)
        return False
    return True


class ClusterInfo(msgspec.Struct, kw_only=True):
    """What `rally up` writes to .rally/cluster.json so other commands find the cluster."""

    api_url: str
    nats_url: str
    postgres_dsn: str
    workdir: str
    pid: int
    #: service instance -> its Prometheus endpoint (docs/observability.md)
    metrics_urls: dict[str, str] = {}
    tokens_file: str = ""  # the API's token file, which `rally tokens` edits


class LocalCluster:
    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 4,
        gpus_per_node: int = 8,
        racks: int = 2,
        nats_url: str | None = None,
        postgres_dsn: str | None = None,
        api_port: int | None = None,
        with_projector: bool = True,
        env: dict[str, str] | None = None,
        service_args: dict[str, Sequence[str]] | None = None,
        with_agents: bool = True,
        queues: Path | None = None,
        allow_root_ranks: bool | None = None,
        mig_gpus: Sequence[int] = (),
        agent_args: Mapping[int, Sequence[str]] | None = None,
        replicas: Mapping[str, int] | None = None,
        nats_servers: int = 1,
        colocate: Sequence[str] = (),
    ) -> None:
        if nodes < 1 or gpus_per_node < 1 or racks < 1:
            raise ValueError("nodes, gpus per node and racks must all be at least 1")
        replicas = {"scheduler": len(SCHEDULERS), **(replicas or {})}
        if set(replicas) - REPLICATED or any(n < 1 for n in replicas.values()):
            raise ValueError(f"only {', '.join(sorted(REPLICATED))} may run as replicas, at least 1 each")
        if nats_servers not in (1, 3, 5):
            raise ValueError(
                "nats_servers: 1, or a JetStream cluster of 3 or 5 (a quorum needs an odd count)"
            )
        if nats_servers > 1 and nats_url is not None:
            raise ValueError("nats_servers starts our own servers: not with nats_url")
        # per service: how many replicas run (default 1; the scheduler a leader and a standby)
        self.replicas = replicas
        # services hosted together, one process per replica over one fold (``runtime.cohost``)
        self.colocate = _checked_colocation(colocate, replicas)
        # a hosted instance's name -> its host process's name (``kill`` / ``restart`` take either)
        self.hosted: dict[str, str] = {}
        # nats-servers of our own: one, or the members of one JetStream cluster (R3/R5 stream and buckets)
        self.nats_servers = nats_servers
        self.workdir = workdir.resolve()
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        # GPUs of every node that run in MIG mode (simulated H100s: ``--mig-gpus`` of each agent)
        self.mig_gpus = tuple(mig_gpus)
        # more arguments for the agent of node index i (0-based), e.g. its ``--label`` / ``--taint``
        self.agent_args = {i: tuple(a) for i, a in (agent_args or {}).items()}
        self.racks = min(racks, nodes)
        self._nats_url = nats_url
        self._postgres_dsn = postgres_dsn
        self.api_port = api_port or free_port()
        self.with_projector = with_projector
        # False: no agent process per node; whoever starts the cluster serves the nodes (the scale
        # harness's fleet) and waits for their registration itself.
        self.with_agents = with_agents
        self.env = dict(os.environ if env is None else env)
        # per service (not instance) name: extra flags, laid over LOCAL_SERVICE_ARGS
        self.service_args: dict[str, Sequence[str]] = {**LOCAL_SERVICE_ARGS, **(service_args or {})}
        self.nats: NatsServer | None = None  # the first of ``nats_cluster``: tools' and tests' server
        self.nats_cluster: list[NatsServer] = []
        # each member's route port, fixed before any starts (every member lists all the routes)
        self._route_ports = [free_port() for _ in range(nats_servers)] if nats_servers > 1 else []
        self.api_ports: dict[str, int] = {}  # API replicas beyond the first: their own HTTP ports
        self.postgres: PostgresServer | None = None
        self.processes: dict[str, ManagedProcess] = {}
        # One preloaded process forks the Python services (``infra.forkserver``): each is still a process
        # of its own, but a start no longer pays the imports fifteen times. RALLY_FORKSERVER=0: exec each.
        self.use_forkserver = os.environ.get("RALLY_FORKSERVER", "1") != "0"
        self.forkserver: ForkServer | None = None
        self.health_ports: dict[str, int] = {}
        self._argv: dict[str, list[str]] = {}
        self._env: dict[str, dict[str, str]] = {}
        # Our own server enforces the production permission matrix; each service connects as its own user.
        self.credentials: LocalCredentials | None = (
            LocalCredentials.generate(self.agent_nodes()) if nats_url is None else None
        )
        # The scheduler's, preemption's and API's queue file; its teams are the ones given tokens.
        self.queues = queues.resolve() if queues is not None else None
        self.teams: tuple[str, ...] = (
            tuple(t.name for t in load_queues(self.queues).teams) if self.queues else DEFAULT_TEAMS
        )
        self.admin_token = ""
        self.team_tokens: dict[str, str] = {}
        # the unprivileged user ranks run as (chosen at start); None: our own user, which only
        # ``allow_root_ranks`` permits (else the start is refused: ranks could read our credentials)
        self.rank_user: str | None = None
        # None (the demo's and the tests' clusters): refused as root when no sandbox can be made; as an
        # ordinary user, who cannot switch users at all, such a one-user cluster runs ranks as that user.
        # `rally up` always passes its --allow-root-ranks flag, so a shared cluster refuses either way.
        self.allow_root_ranks = os.geteuid() != 0 if allow_root_ranks is None else allow_root_ranks

    # -- addresses --------------------------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        """The URL tools and tests use: on our own server, as the admin user (credentials in the URL)."""
        if self._nats_url is not None:
            return self._nats_url
        if not self.nats_cluster or self.credentials is None:
            raise RuntimeError("NATS is not started")
        password = self.credentials.passwords[ADMIN]
        return ",".join(server.url_for(ADMIN, password) for server in self.nats_cluster)

    @property
    def _service_nats_url(self) -> str:
        # Services get the bare URL and their own user in their environment (never on a command line).
        if self._nats_url is not None:
            return self._nats_url
        if not self.nats_cluster:
            raise RuntimeError("NATS is not started")
        return ",".join(server.url for server in self.nats_cluster)

    @property
    def postgres_dsn(self) -> str:
        if self._postgres_dsn is not None:
            return self._postgres_dsn
        if self.postgres is None:
            raise RuntimeError("PostgreSQL is not started")
        return self.postgres.dsn

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def node_ids(self) -> list[str]:
        return [f"node-{i + 1}" for i in range(self.nodes)]

    def agent_nodes(self) -> list[str]:
        """The nodes served by an agent process of this cluster (none ``with_agents=False``)."""
        return self.node_ids() if self.with_agents else []

    @property
    def tokens_file(self) -> Path:
        """The API's token file (hashes only); `rally tokens` edits it while the cluster runs."""
        return self.workdir / "api-tokens.json"

    @property
    def kept_tokens_file(self) -> Path:
        """The cluster's own tokens themselves (owner-only), kept for its next start in this folder."""
        return self.workdir / "local-tokens.json"

    def token_for(self, team: str) -> str:
        """The API token of ``team`` (one of ``self.teams``), for calls made as that team."""
        try:
            return self.team_tokens[team]
        except KeyError:
            raise KeyError(
                f"no token for team {team!r}; this cluster's teams: {', '.join(self.teams)}"
            ) from None

    @property
    def checkpoint_root(self) -> Path:
        """Where the jobs' checkpoints live: the local stand-in for a shared filesystem."""
        return self.workdir / "checkpoints"

    @property
    def shared_dir(self) -> Path:
        """A folder every rank may read and write besides its own (the local stand-in for a shared
        scratch filesystem; each agent's ``--rank-path``). Tests give their ranks' output folders here."""
        return self.workdir / "shared"

    def rack_of(self, index: int) -> str:
        # Contiguous blocks, as racks are cabled: nodes 1-2 in rack-1, 3-4 in rack-2 for 4 nodes / 2 racks.
        return f"rack-{index * self.racks // self.nodes + 1}"

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, *, timeout: float = 60.0) -> None:
        check_ports(self.fixed_ports())  # first: a port another process holds starts nothing
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        # Only our user enters the cluster's folder (service logs, the log's store, tokens): a rank sees of
        # it what its sandbox binds back, its attempt's folder, checkpoints/ and shared/ (issue 30).
        self.workdir.chmod(0o700)
        if self.agent_nodes():
            self._choose_rank_user()  # first: a refusal starts nothing
        if self.use_forkserver:  # it preloads while NATS and PostgreSQL start
            self.forkserver = ForkServer(self.workdir / "logs" / "forkserver.log")
        if self._nats_url is None:
            self._start_nats()
        self._setup_log()
        if self.with_projector and self._postgres_dsn is None:
            # PostgreSQL is only a projection of the log (rebuildable), so its data lives in a throwaway
            # temp dir: that one is traversable by the unprivileged user postgres must run as under root.
            self.postgres = PostgresServer().start()
        self._make_tokens()
        for name in instances("api", self.replicas.get("api", 1)):
            port = self.api_port if name == "api" else self.api_ports.setdefault(name, free_port())
            api_args = ["--http-host", "127.0.0.1", "--http-port", str(port)]
            self.start_service(name, "api", [*api_args, "--tokens-file", str(self.tokens_file)])
        for service in SINGLETONS:
            if (service == "projector" and not self.with_projector) or service in self.colocate:
                continue
            for name in instances(service, self.replicas.get(service, 1)):
                self.start_service(name, service)
        self._start_hosts()
        for instance in instances("scheduler", self.replicas["scheduler"]):
            self.start_service(instance, "scheduler", ["--instance", instance])
        for index, node_id in enumerate(self.agent_nodes()):
            self.start_service(f"agent-{node_id}", "agent", self._agent_args(index, node_id))
        self.wait_ready(timeout=timeout)

    def _start_nats(self) -> None:
        """Our own nats-server, or the members of one JetStream cluster on loopback: each enforces the
        production permission matrix with the same accounts."""
        assert self.credentials is not None
        accounts = render_accounts(self.agent_nodes(), password=literal(self.credentials.passwords))
        if self.nats_servers == 1:
            self.nats_cluster = [
                NatsServer(self.workdir / "nats", server_name="rally-local", accounts=accounts)
            ]
        else:
            routes = tuple(f"nats-route://127.0.0.1:{port}" for port in self._route_ports)
            self.nats_cluster = [
                NatsServer(
                    self.workdir / f"nats-{i + 1}",
                    server_name=f"rally-local-{i + 1}",
                    accounts=accounts,
                    cluster_name="rally-local",
                    cluster_port=port,
                    routes=routes,
                )
                for i, port in enumerate(self._route_ports)
            ]
        for server in self.nats_cluster:
            server.start()
        self.nats = self.nats_cluster[0]

    def _setup_log(self, timeout: float = 60.0) -> None:
        """The admin identity creates the stream and buckets; services may not (and fail without them).
        On a JetStream cluster they are replicated on every member (R3 or R5), retried until the members
        have elected their meta leader (a fresh cluster refuses stream creation for a few seconds)."""
        from rallypoint.eventlog import connect_nats
        from rallypoint.eventlog.setup import setup_log

        async def setup() -> None:
            nc = await connect_nats(self.nats_url, name="rally-local-setup")
            deadline = time.monotonic() + timeout
            try:
                while True:
                    try:
                        await setup_log(nc, replicas=self.nats_servers if self._nats_url is None else 1)
                        return
                    except Exception as exc:  # the meta leader is not elected yet: its errors vary
                        if time.monotonic() > deadline:
                            raise RuntimeError(
                                f"the JetStream cluster made no stream in {timeout:.0f} s"
                            ) from exc
                        await asyncio.sleep(0.25)
            finally:
                await nc.close()

        # In a thread: start() may run inside an event loop (an async test), where asyncio.run cannot.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, setup()).result()

    def _choose_rank_user(self) -> None:
        """Ranks run as an unprivileged user in a sandbox of their own (``rankuser``), or as ours only
        with ``allow_root_ranks``; RankUserRefused otherwise."""
        agents = self.workdir / "agents"
        agents.mkdir(parents=True, exist_ok=True)
        self.rank_user = resolve_rank_user(
            requested_rank_user(), agents, allow_own_user=self.allow_root_ranks
        )
        self.give_to_ranks(self.checkpoint_root)
        self.give_to_ranks(self.shared_dir)

    def give_to_ranks(self, path: Path) -> Path:
        """Create ``path`` and let the ranks write in it (they may run as another user than ours)."""
        if self.rank_user is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            give_to(path, self.rank_user)
        return path

    def _make_tokens(self) -> None:
        """One admin token and one per team: the folder's from its last run where the API's file still
        accepts them, with every token and revocation made since (``localtokens``), else new ones.

        Registered for the API's address, so this process's calls (``localcluster.http``) go as admin.
        """
        tokens = keep_or_make_tokens(self.tokens_file, self.kept_tokens_file, self.teams)
        self.admin_token, self.team_tokens = tokens.admin, tokens.teams
        register_token(self.api_url, self.admin_token)

    def write_tokens(self, path: Path) -> None:
        """``.rally/tokens.json`` for `rally up`: the tokens themselves, so owner-only (mode 600)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        path.write_text(json.dumps({"admin": self.admin_token, "teams": self.team_tokens}, indent=2) + "\n")

    def _service_env(self, name: str, service: str) -> dict[str, str]:
        """The service's environment: its own NATS user and, for the projector alone, the PostgreSQL DSN.
        Secrets go here, never on a command line, which every local user can read in `ps`."""
        env = {key: value for key, value in self.env.items() if key != POSTGRES_DSN_ENV}
        if self.credentials is not None:
            user = agent_user(name.removeprefix("agent-")) if service == "agent" else service
            env.update(self.credentials.env_for(user))
        if service == "projector":
            env[POSTGRES_DSN_ENV] = self.postgres_dsn
        return env

    def _agent_args(self, index: int, node_id: str) -> list[str]:
        return [
            "--node-id",
            node_id,
            "--rack",
            self.rack_of(index),
            "--gpus",
            str(self.gpus_per_node),
            "--backend",
            "sim",
            "--address",
            "127.0.0.1",
            "--work-dir",
            str(self.workdir / "agents" / node_id),
            "--fault-file",
            str(self.fault_file(node_id)),
            "--rank-path",
            str(self.shared_dir),
            *(["--rank-path", str(EXAMPLES)] if EXAMPLES.is_dir() else []),
            *(["--run-as", self.rank_user] if self.rank_user else ["--allow-root-ranks"]),
            *(["--mig-gpus", ",".join(map(str, self.mig_gpus))] if self.mig_gpus else []),
            *self.agent_args.get(index, ()),
        ]

    def fault_file(self, node_id: str) -> Path:
        """The simulated faults of ``node_id``'s GPUs, NICs and speed (``rallypoint.agent.sim_backend``),
        re-read by its agent whenever it changes."""
        return self.workdir / "faults" / node_id

    def inject_faults(self, node_id: str, spec: str) -> None:
        """Replace ``node_id``'s simulated faults with ``spec`` (empty: none), whole or not at all."""
        path = self.fault_file(node_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".writing")
        partial.write_text(spec)
        partial.replace(path)

    def start_service(self, name: str, service: str, extra: Sequence[str] = ()) -> ManagedProcess:
        args = self._service_args(name, service, extra)
        self._argv[name] = [sys.executable, "-m", "rallypoint.cli.serve", *args]
        self._env[name] = self._service_env(name, service)
        proc = self._spawn(name)
        self.processes[name] = proc
        return proc

    def _service_args(self, name: str, service: str, extra: Sequence[str] = ()) -> list[str]:
        """``rally serve``'s arguments for instance ``name`` of ``service`` (its health port chosen)."""
        own = list(self.service_args.get(service, ()))
        if service in ("job-controller", "api"):  # the API holds a job's own checkpoint_dir inside it
            own += ["--checkpoint-root", str(self.checkpoint_root)]
        args = [service, "--nats-url", self._service_nats_url, *own, *extra]
        if service != "agent" and "--instance" not in extra:
            args += ["--instance", name]
        if service in QUEUE_READERS and self.queues is not None:
            args += ["--queues", str(self.queues)]
        if service != "api":  # the API answers /healthz on its own HTTP port
            self.health_ports[name] = self.health_ports.get(name) or free_port()
            args += ["--health-port", str(self.health_ports[name])]
        return args

    def _start_hosts(self) -> None:
        """One process per replica hosting the colocated services (``rally serve host``): replica i of
        each, each service on its own NATS user (a password file, as a mounted secret would be)."""
        if not self.colocate:
            return
        # Every file written before any host starts: a host reads them as it starts, and a file written
        # again for the next host could be read empty in between.
        passwords = {service: self._password_file(service) for service in self.colocate if self.credentials}
        count = self.replicas.get(self.colocate[0], 1)
        for index, host in enumerate(instances("host", count)):
            groups: list[str] = []
            for service in self.colocate:
                name = instances(service, count)[index]
                self.hosted[name] = host
                groups += [*(["::"] if groups else []), *self._service_args(name, service)]
                if service in passwords:
                    groups += ["--nats-user", service, "--nats-password-file", str(passwords[service])]
            self._argv[host] = [sys.executable, "-m", "rallypoint.cli.serve", "host", *groups]
            self._env[host] = {key: value for key, value in self.env.items() if key != POSTGRES_DSN_ENV}
            self.processes[host] = self._spawn(host)

    def _password_file(self, user: str) -> Path:
        """``user``'s NATS password in a file only we may read (inside the cluster's 0700 folder), written
        whole: under another name, then renamed."""
        assert self.credentials is not None
        path = self.workdir / "secrets" / f"{user}.nats-password"
        path.parent.mkdir(mode=0o700, exist_ok=True)
        partial = path.with_suffix(".writing")
        partial.touch(mode=0o600, exist_ok=True)
        partial.write_text(self.credentials.passwords[user] + "\n")
        partial.replace(path)
        return path

    def _spawn(self, name: str) -> ManagedProcess:
        log_path = self.workdir / "logs" / f"{name}.log"
        if self.forkserver is not None:
            return ForkedProcess(
                self.forkserver, self._argv[name], log_path=log_path, env=self._env[name], cwd=self.workdir
            )
        return ManagedProcess(self._argv[name], log_path=log_path, env=self._env[name], cwd=self.workdir)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one service abruptly, as a crash would (default kill -9); a hosted one's whole host."""
        proc = self.processes[self.hosted.get(name, name)]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        with contextlib.suppress(Exception):
            proc.popen.wait(10)

    def restart(self, name: str) -> ManagedProcess:
        name = self.hosted.get(name, name)  # a hosted service restarts with its host
        old = self.processes.get(name)
        if old is not None and old.running():
            old.stop()
        proc = self._spawn(name)
        self.processes[name] = proc
        return proc

    def freeze_node(self, node_id: str, sig: int = signal.SIGSTOP) -> None:
        """Hang a node as a wedged machine does (SIGSTOP its agent and every rank it runs), or thaw it
        (SIGCONT). For tests, benchmarks and the demo: nothing answers, nothing exits, nothing is killed."""
        os.kill(self.processes[f"agent-{node_id}"].pid, sig)
        for pid_file in sorted((self.workdir / "agents" / node_id).glob("*/*/rank-*.pid")):
            record = workdir.read_record(pid_file) or {}
            for pid_key, start_key in (("pid", "pid_start"), ("wrapper_pid", "wrapper_start")):
                workdir.signal_group(record.get(pid_key), record.get(start_key), signal.Signals(sig))

    def dead_services(self) -> list[str]:
        return sorted(name for name, proc in self.processes.items() if not proc.running())

    def supervise(self) -> list[str]:
        """Restart whatever died, servers first (on their own port and data, so every client reconnects to
        the address it knows), then the services; returns what was restarted. A server that fails to come
        back is tried again on the next call. Call it from a long-lived thread (the parent-death signal of
        a child is tied to the thread that spawned it)."""
        servers: list[tuple[str, NatsServer | PostgresServer | None]] = [
            *self.nats_names(),
            ("postgres", self.postgres),
        ]
        restarted = [name for name, server in servers if server is not None and _revive(name, server)]
        for name in self.dead_services():
            self.restart(name)
            restarted.append(name)
        return restarted

    def nats_names(self) -> list[tuple[str, NatsServer]]:
        """Our nats-servers by the name `supervise` reports: ``nats-server``, or ``nats-server-<i>`` each."""
        if len(self.nats_cluster) == 1:
            return [("nats-server", self.nats_cluster[0])]
        return [(f"nats-server-{i + 1}", server) for i, server in enumerate(self.nats_cluster)]

    def fixed_ports(self, services: Sequence[str] | None = None) -> list[Port]:
        """The ports chosen before their services start (of ``services``, default all): the API's, and the
        health and metrics ports of services started before. NATS and PostgreSQL pick theirs as they start."""
        if services is not None:  # a host's services' ports with it
            services = [*services, *(name for name, host in self.hosted.items() if host in services)]
        ports = {"api": Port(self.api_port, "the API's", "--api-port")}
        for name, port in sorted(self.api_ports.items()):
            ports[name] = Port(port, f"{name}'s")
        for name, port in sorted(self.health_ports.items()):
            ports[name] = Port(port, f"{name}'s health and metrics")
        return [port for name, port in ports.items() if services is None or name in services]

    def metrics_urls(self) -> dict[str, str]:
        """Every service's /metrics: the API's own port, the others' health ports."""
        urls = {"api": f"{self.api_url}/metrics"}
        for name, port in sorted(self.api_ports.items()):
            urls[name] = f"http://127.0.0.1:{port}/metrics"
        for name, port in sorted(self.health_ports.items()):
            urls[name] = f"http://127.0.0.1:{port}/metrics"
        return urls

    def health(self, name: str, path: str = "/readyz") -> tuple[int, Any]:
        """A service's health answer (status code, body); (0, {}) when it does not answer."""
        port = self.api_port if name == "api" else self.api_ports.get(name) or self.health_ports[name]
        try:
            return call("GET", f"http://127.0.0.1:{port}{path}", timeout=2.0)
        except OSError:
            return 0, {}

    def wait_ready(self, *, timeout: float) -> None:
        """Until the API answers and every node agent has registered."""
        deadline = time.monotonic() + timeout
        expected = set(self.agent_nodes())
        last_error = ""
        while time.monotonic() < deadline:
            dead = self.dead_services()
            if dead:
                check_ports(self.fixed_ports(dead))  # taken since the first check: say so, as then
                tails = "\n".join(f"--- {n}\n{_start_log(self.processes[n])}" for n in dead)
                raise RuntimeError(f"services died while starting: {', '.join(dead)}\n{tails}")
            try:
                status, nodes = call("GET", f"{self.api_url}/v1/nodes", timeout=2, token=self.admin_token)
                registered = {n["node_id"] for n in nodes.get("nodes", [])} if status == 200 else set()
                if expected <= registered:
                    return
                last_error = f"{len(registered & expected)}/{len(expected)} nodes registered (HTTP {status})"
            except OSError as exc:
                last_error = str(exc)
            time.sleep(0.2)
        raise TimeoutError(f"cluster not ready after {timeout:.0f} s: {last_error}")

    def write_info(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Owner-only: the NATS URL carries the admin password of this local cluster.
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        info = ClusterInfo(
            api_url=self.api_url,
            nats_url=self.nats_url,
            postgres_dsn=self.postgres_dsn if self.with_projector else "",
            workdir=str(self.workdir),
            pid=os.getpid(),
            tokens_file=str(self.tokens_file),
            metrics_urls=self.metrics_urls(),
        )
        path.write_bytes(msgspec.json.format(msgspec.json.encode(info)))

    def stop(self) -> None:
        """Agents first (they stop their ranks), then the services, then the servers."""
        self._mark_running_ranks_stopped()
        names = sorted(self.processes, key=lambda n: (not n.startswith("agent-"), n))
        for name in names:
            with contextlib.suppress(Exception):
                self.processes[name].stop(timeout=10)
        self._kill_leftover_ranks()
        if self.forkserver is not None:
            with contextlib.suppress(Exception):
                self.forkserver.stop()
        if self.postgres is not None:
            with contextlib.suppress(Exception):
                self.postgres.stop()
        for server in self.nats_cluster:
            with contextlib.suppress(Exception):
                server.stop(remove_data=False)
        register_token(self.api_url, None)

    def _mark_running_ranks_stopped(self) -> None:
        """Record the end of every rank still running as the cluster's doing, before anything stops them.

        Exit records are written once (exclusively): the one written here wins over the code the
        wrapper sees when its rank is killed (137, 143), so the agents report, now or when the cluster
        comes back, ``EXIT_CLUSTER_STOPPED``, and the job controller requeues the job as interrupted by
        the infrastructure instead of failing it for the user.
        """
        now = time.time()
        for node_id in self.agent_nodes():
            for pid_file in sorted((self.workdir / "agents" / node_id).glob("*/*/rank-*.pid")):
                exit_file = pid_file.with_suffix(".exit")
                if not exit_file.exists():
                    record = {"exit_code": workdir.EXIT_CLUSTER_STOPPED, "at": now}
                    workdir.write_atomic(exit_file, record, exclusive=True)

    def _kill_leftover_ranks(self) -> None:
        """Ranks outlive their agent by design (an agent restart must not kill training); a cluster
        shutdown must not leave them running, so sweep every process group the agents recorded. Whether
        a rank has an exit record says nothing here: ``_mark_running_ranks_stopped`` just wrote one for
        every rank still running. A group that ended is left alone (``signal_group`` checks it is still
        the rank's)."""
        for node_id in self.agent_nodes():
            for pid_file in sorted((self.workdir / "agents" / node_id).glob("*/*/rank-*.pid")):
                record = workdir.read_record(pid_file)
                if record is None:
                    continue
                # Each rank leads its own process group (the wrapper made it so): stop the group.
                workdir.signal_group(record.get("pid"), record.get("pid_start"), signal.SIGKILL)
                workdir.signal_group(record.get("wrapper_pid"), record.get("wrapper_start"), signal.SIGKILL)

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _start_log(proc: ManagedProcess, limit: int = 1500) -> str:
    """The last ``limit`` bytes of a service's log from its first whole line: a JSON record cut mid-field
    reads as another error."""
    tail = proc.log_tail(limit)
    cut = proc.log_tail(limit + 1) != tail
    return tail.split("\n", 1)[-1] if cut else tail
