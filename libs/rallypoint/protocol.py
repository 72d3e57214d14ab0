"""Commands between the job controller and node agents, and agent heartbeats (not events).

These are commands and telemetry, not facts: they travel on core NATS subjects
(``cmd.agent.<node>.<verb>`` request/reply, ``hb.<node>``) and never enter the log. What an agent
*did* (a rank exited) is appended to the log by the agent itself. Every command is idempotent, keyed
by (job id, attempt, rank), so the controller can resend after a timeout or a restart.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from rallypoint.events.catalogue import MigSlice


class RankSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    rank: int
    local_rank: int
    gpus: tuple[int, ...]


class LaunchTask(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Start every rank of one task (one node's share of a gang). ``env`` holds the whole contract.

    Fields at their default are not sent: a job without secrets sends no ``secrets``, which an agent that
    predates the field (and refuses fields it does not know) still decodes during a rolling upgrade.

    ``secrets``: the job's secret variables, name -> value, read by the job controller from the secrets
    bucket for this launch alone. They reach the ranks' environment and nothing else: the agent keeps the
    task on disk without them (``without_secrets``), and ``repr`` names them without their values.
    """

    job_id: str
    attempt: int
    node_id: str
    node_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    ranks: tuple[RankSpec, ...]
    command: tuple[str, ...]
    env: dict[str, str] = {}
    secrets: dict[str, str] = {}
    #: the share of its one GPU a fractional job's rank gets, in thousandths (0: whole GPUs). Such a GPU
    #: runs several jobs' ranks at once: the agent never evicts one sharer for another (``_evict``)
    gpu_milli: int = 0
    #: a MIG job's slice of its one GPU: the agent makes (or reuses) that GPU instance and shows the rank
    #: its device alone (``CUDA_VISIBLE_DEVICES`` = the instance's UUID)
    mig: MigSlice | None = None
    #: an interactive job's task: each rank runs on a pseudo-terminal its wrapper holds, which the agent
    #: relays to the user through the API (``agent.terminal``)
    pty: bool = False
    #: the ports the job publishes (``JobSpec.ports``): the agent forwards connections to these alone
    ports: tuple[int, ...] = ()

    def __repr__(self) -> str:
        # a log line, a traceback's locals or a debugger shows the task; never a secret's value
        shown = ", ".join(
            f"{name}={getattr(self, name)!r}" for name in self.__struct_fields__ if name != "secrets"
        )
        return f"LaunchTask({shown}, secrets=<hidden: {', '.join(sorted(self.secrets))}>)"

    def without_secrets(self) -> LaunchTask:
        """The task as it may be written down: everything but the secrets' values."""
        return msgspec.structs.replace(self, secrets={}) if self.secrets else self


#: ``LaunchReply.code`` of a refused launch: why the agent will never run this task as sent. Empty from
#: an agent that predates codes (the controller then retries, as it did before codes).
REFUSED_BAD_REQUEST = "bad_request"  # the task did not decode (controller and agent disagree on the format)
REFUSED_WRONG_NODE = "wrong_node"  # the task names another node (the bind and the agents disagree)
REFUSED_UNKNOWN_GPUS = "unknown_gpus"  # GPUs this node no longer has (it changed under the bind)
REFUSED_EMPTY_COMMAND = "empty_command"  # the job's spec cannot run: no command
REFUSED_SUPERSEDED = "superseded"  # a newer attempt of the job runs on the node: this launch came too late


class LaunchReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    error: str = ""
    code: str = ""  # one of REFUSED_* when ok is False; optional, so an older agent's reply decodes
    already_running: bool = False
    # Added by the agent: which ranks this request started, and which had been started before.
    started: tuple[int, ...] = ()
    already: tuple[int, ...] = ()


class KillTask(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Stop the ranks of (job, attempt) on this node: SIGTERM, then SIGKILL after ``grace_s``."""

    job_id: str
    attempt: int
    grace_s: float = 5.0


class KillReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    signalled: int = 0
    error: str = ""


class RankStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    job_id: str
    attempt: int
    rank: int
    pid: int
    exit_code: int | None = None
    # the rank's latest progress report (training client): step reached, seconds per step, when
    step: int | None = None
    step_time_s: float | None = None
    progress_at: float | None = None


class StatusReply(msgspec.Struct, frozen=True, kw_only=True):
    """Answer to ``cmd.agent.<node>.status`` (any body): every rank this agent knows about."""

    node_id: str
    agent_instance: str
    ranks: tuple[RankStatus, ...] = ()


class GpuSample(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One GPU's health. ``utilization`` is percent busy (0-100, as nvidia-smi shows it).

    Every field after ``memory_used_mib`` has a default, so a heartbeat from an older agent (which sends
    fewer of them) still decodes; counters are cumulative since the driver loaded (NVML's volatile ones),
    so a reader judges their increase, not their value.

    A field at its default is left out of the JSON (``omit_defaults``, as on the heartbeat and its other
    parts), which decodes to the same value: a healthy idle 8-GPU node's heartbeat is ~0.6 KB instead of
    ~2 KB, and at 2,500 heartbeats a second that is what nats-server carries and the monitor parses.
    """

    index: int
    temperature_c: float
    utilization: float
    memory_used_mib: int
    ecc_uncorrectable: int = 0
    xid: int = 0
    #: Any of the three throttle reasons below, for readers that predate them (liveness.py).
    throttled: bool = False
    #: Clock-throttle reasons that mean "slowed down against its will" (SW/HW thermal slowdown, HW power
    #: brake, HW slowdown). Software power capping at TDP is normal under load and is not reported.
    throttle_thermal: bool = False
    throttle_power_brake: bool = False
    throttle_hw_slowdown: bool = False
    #: Corrected (single-bit) ECC errors, volatile counter: a burst foretells a failing HBM row.
    ecc_corrected: int = 0
    #: NVLink CRC (data + flit), replay and recovery errors summed over the GPU's links.
    nvlink_errors: int = 0


class NicSample(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One network port (InfiniBand port ``mlx5_0/1`` or Ethernet interface ``eth0``) at one instant.

    ``speed_gbps``: what the link negotiated (0 when down or unknown). ``errors``: cumulative symbol and
    receive errors as the port counts them (sysfs), so a reader judges the increase, as for
    ``link_downed``.
    """

    name: str
    link_up: bool = True
    speed_gbps: float = 0.0
    errors: int = 0
    #: How often the link went down (cumulative): a flap shorter than the heartbeat period shows here
    #: even when no sample caught the link down.
    link_downed: int = 0


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    node_id: str
    agent_instance: str
    at: float
    gpus: tuple[GpuSample, ...] = ()
    ranks: tuple[RankStatus, ...] = ()
    #: Empty from an agent that predates NIC reporting, and from the scale harness's fake agents.
    nics: tuple[NicSample, ...] = ()


class LogsRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ask ``cmd.agent.<node>.logs`` for up to ``max_bytes`` of a rank's output from byte ``offset``."""

    job_id: str
    attempt: int
    rank: int
    offset: int = 0
    max_bytes: int = 65536


class LogsReply(msgspec.Struct, frozen=True, kw_only=True):
    """A chunk of the rank's log: ``text`` holds whole UTF-8 characters only, ``next_offset`` is where the
    next request starts, ``size`` the file's size when read (``found`` False: no such log on this node)."""

    ok: bool
    error: str = ""
    found: bool = False
    offset: int = 0
    next_offset: int = 0
    size: int = 0
    text: str = ""


class TerminalRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ask ``cmd.agent.<node>.tty`` about an interactive rank's terminal (``agent.terminal``).

    ``open``: relay the terminal of (job, attempt, rank) to ``session`` from now on: output on
    ``tty.<node>.<session>``, input taken from ``cmd.agent.<node>.tty.<session>``; a session already
    attached to that terminal is closed (the last attach wins). ``info``: is any session attached?
    ``forward``: the same for one TCP connection to ``port`` on the node's loopback, where the rank listens
    (a port the job publishes; one session per connection).
    """

    op: Literal["open", "info", "forward"]
    job_id: str
    attempt: int
    rank: int
    session: str = ""
    port: int = 0
    #: ``open``: the team's disconnect grace; a terminal detached this long (and a margin) is hung up by
    #: the agent itself should the API not end it (0: never)
    grace_s: float = 0.0


class TerminalReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    error: str = ""
    #: a session is attached to that terminal (``info``), or was just taken over (``open``)
    attached: bool = False
