"""Who may publish and subscribe to what on NATS: the one permission matrix (pure data).

Every identity gets exactly the subjects its role writes (``rallypoint.events.subjects`` names them and
ties each event type to one subject) plus the JetStream API calls it makes, and nothing else:

- reading the log: stream info, ephemeral ordered consumers (their filter rides in the create subject),
  message get / direct get, flow-control replies; never a stream create, update, delete or purge, never a
  message delete, never a consumer delete. Only ``admin`` sets the streams up (``rallypoint.security.setup``);
- the leader lease (KV ``rally-leader``): the scheduler and the projector, each only its own key;
- partitions (KV ``rally-partitions``): a partitioned service's replicas, only that service's keys;
- snapshots: each role that folds the whole log (``SNAPSHOT_ROLES``) saves and loads its own, in an object
  store of its own (``rally-snapshots-<role>``: chunk subjects are random, so only the bucket can tell
  writers apart), and records each save on ``rally.snap.<role>``. Replacing an object purges its old
  chunks, so it may purge its bucket's stream, never ``RALLY``;
- request/reply: each identity has inboxes of its own, ``_INBOX.<user>.>`` (``inbox_prefix``: its replies
  and its consumers' deliveries arrive there), subscribes to those alone, so no identity receives another's
  replies, and answers only through ``allow_responses`` (no publish on ``_INBOX.>``).

A node agent is one identity per node (``agent_user``), and speaks only for that node: heartbeats on
``hb.<node>``, ``NodeRegistered`` on ``rally.node.<node>.agent`` (never a verdict: those are the health
monitor's ``rally.node.<node>.health``), its other events under ``rally.agent.<node>.>``,
its commands on ``cmd.agent.<node>.>``. The deploy configs are generated from this module
(``rallypoint.security.natsconf``; ``rally nats config``), and a test fails when they drift.
"""

from __future__ import annotations

from dataclasses import dataclass

from rallypoint.events import subjects

STREAM = "RALLY"
LEADER_BUCKET = "rally-leader"
PARTITION_BUCKET = "rally-partitions"
SECRETS_BUCKET = "rally-secrets"
SNAPSHOT_BUCKET_PREFIX = "rally-snapshots"
#: The roles that fold the whole log and keep a snapshot of the fold, each its own.
SNAPSHOT_ROLES = ("api", "inventory", "scheduler", "preemption", "checkpoint", "job-controller")

ADMIN = "admin"
AGENT = "agent"


@dataclass(frozen=True, slots=True)
class Permissions:
    """One identity's NATS permissions: subjects it may publish and subscribe to (NATS wildcards)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool
    writes: str  # one line: which events it appends, for the config's comment and the docs


def _js_api(call: str) -> str:
    return f"$JS.API.{call}"


def read_stream(stream: str) -> tuple[str, ...]:
    """What reading a stream takes: info, ordered consumers, message gets, flow-control replies."""
    return (
        _js_api(f"STREAM.INFO.{stream}"),
        _js_api(f"CONSUMER.CREATE.{stream}"),
        _js_api(f"CONSUMER.CREATE.{stream}.>"),
        _js_api(f"STREAM.MSG.GET.{stream}"),
        _js_api(f"DIRECT.GET.{stream}"),
        _js_api(f"DIRECT.GET.{stream}.>"),
        f"$JS.FC.{stream}.>",
    )


def leader_lease(key: str) -> tuple[str, ...]:
    """The leader lease ``key`` in KV ``rally-leader``: read the bucket, write only that key."""
    return (*read_stream(f"KV_{LEADER_BUCKET}"), f"$KV.{LEADER_BUCKET}.{key}")


def partition_keys(service: str) -> tuple[str, ...]:
    """A partitioned service's presence and partition leases in KV ``rally-partitions``
    (``runtime.partitions``): read and watch the bucket, write only that service's keys."""
    bucket_stream = f"KV_{PARTITION_BUCKET}"
    return (
        *read_stream(bucket_stream),
        _js_api(f"CONSUMER.INFO.{bucket_stream}.>"),  # a KV watch reads its consumer's pending count
        f"$KV.{PARTITION_BUCKET}.{service}.>",
    )


def job_secrets() -> tuple[str, ...]:
    """A job's secrets in KV ``rally-secrets`` (``eventlog.secretstore``): bind the bucket, get one key,
    put or purge one key. No consumer: nobody lists or watches the bucket."""
    bucket_stream = f"KV_{SECRETS_BUCKET}"
    return (
        _js_api(f"STREAM.INFO.{bucket_stream}"),
        _js_api(f"DIRECT.GET.{bucket_stream}.>"),
        f"$KV.{SECRETS_BUCKET}.*",
    )


def snapshot_bucket(role: str) -> str:
    """The object store of ``role``'s snapshot, which no other identity may write."""
    return f"{SNAPSHOT_BUCKET_PREFIX}-{role}"


def snapshots(role: str) -> tuple[str, ...]:
    """Load and save ``role``'s own snapshot and record each save; a save purges the replaced object's
    chunks (that bucket only). nats-py's object get looks its stream up by subject (``STREAM.NAMES``:
    stream names only)."""
    bucket = snapshot_bucket(role)
    bucket_stream = f"OBJ_{bucket}"
    return (
        *read_stream(bucket_stream),
        _js_api("STREAM.NAMES"),
        f"$O.{bucket}.>",
        _js_api(f"STREAM.PURGE.{bucket_stream}"),
        subjects.snapshot_taken(role),
    )


INBOX_ROOT = "_INBOX"  # nats-py's default inbox prefix


def inbox_prefix(user: str | None) -> str:
    """The inbox prefix a connection of ``user`` uses (nats-py's ``inbox_prefix``): ``_INBOX.<user>``.
    ``_INBOX`` for no user or a name that is no subject token: no user of this matrix, so none of its
    permissions apply."""
    if user is None or not subjects.TOKEN_PATTERN.match(user):
        return INBOX_ROOT
    return f"{INBOX_ROOT}.{user}"


def own_inboxes(user: str) -> str:
    """The inboxes ``user`` may subscribe to: its own, never another identity's."""
    return f"{inbox_prefix(user)}.>"


LOG = read_stream(STREAM)


def _service(*, writes: str, publish: tuple[str, ...] = (), serves: bool = False) -> Permissions:
    role_subjects = (*publish, *LOG)
    return Permissions(publish=role_subjects, subscribe=(), allow_responses=serves, writes=writes)


def _queries(role: str) -> tuple[str, ...]:
    return (f"q.{role}.>",)


def _with_snapshots(perms: Permissions, role: str) -> Permissions:
    return Permissions(
        publish=(*perms.publish, *snapshots(role)),
        subscribe=perms.subscribe,
        allow_responses=perms.allow_responses,
        writes=perms.writes,
    )


def _with_subscriptions(perms: Permissions, *extra: str) -> Permissions:
    return Permissions(
        publish=perms.publish,
        subscribe=(*perms.subscribe, *extra),
        allow_responses=perms.allow_responses,
        writes=perms.writes,
    )


def _matrix() -> dict[str, Permissions]:
    one = "*"  # one subject token: a job or node id
    roles = {
        ADMIN: Permissions(
            publish=(">",), subscribe=(">",), allow_responses=False, writes="everything: sets up the streams"
        ),
        "api": _service(
            # rally.node.*.op: an operator's drain and undrain (admin tokens only: the API checks the token)
            writes="JobSubmitted, JobCancelRequested, an operator's NodeDrained and NodeUndrained; "
            "asks agents for rank logs; relays interactive terminals",
            # rally-secrets: stores a submission's secrets before its JobSubmitted
            publish=(
                f"rally.job.{one}",
                f"rally.node.{one}.op",
                "q.>",
                f"cmd.agent.{one}.logs",
                # interactive sessions: open one (request/reply), then its keystrokes (agent.terminal)
                f"cmd.agent.{one}.tty",
                f"cmd.agent.{one}.tty.{one}",
                *job_secrets(),
            ),
            serves=False,
        ),
        "inventory": _service(writes="nothing (answers q.inventory.nodes)", serves=True),
        "health-monitor": _service(
            writes="NodeHeartbeatLost, NodeDrained, NodeLost, NodeRecovered, NodeHealthChanged, "
            "its partitions' LeaderEpochStarted",
            # rally-partitions: its replicas' presence and partition leases; each partition's epoch (five
            # tokens under rally.node: no node's own subject)
            publish=(
                f"rally.node.{one}.health",
                f"rally.node.partition.{one}.epoch",
                *partition_keys(subjects.HEALTH_ROLE),
            ),
        ),
        "scheduler": _service(
            writes="LeaderEpochStarted, SchedulerSettings, GangBound, GangsBound, PreemptionRequested, "
            "GangResized, JobPending, GangRepaired, JobRequeued, JobQueued, JobRejected",
            publish=(subjects.SCHEDULER_TREE, f"rally.queue.{one}", *leader_lease("scheduler")),
        ),
        # follows evictions and writes nothing: since the scheduler writes its preemption requests, nobody
        # may write the old preemption tree (rally.preempt.>, read in old logs only); rally-partitions: its
        # replicas' presence keys, which split the evictions among them (no leases, no epochs)
        "preemption": _service(writes="nothing (follows evictions)", publish=partition_keys("preemption")),
        "checkpoint": _service(
            writes="CheckpointVerified, CheckpointDeleted, its partitions' LeaderEpochStarted",
            # rally-partitions: its replicas' presence and partition leases; each partition's epoch (four
            # tokens under rally.ckpt: no job's own subject)
            publish=(
                f"rally.ckpt.{one}",
                f"rally.ckpt.epoch.{one}",
                *partition_keys(subjects.CHECKPOINT_ROLE),
            ),
        ),
        "job-controller": _service(
            writes="JobStarted, JobCompleted, JobFailed, JobAttemptFailed, JobInterrupted, JobCancelled, "
            "JobPreempted, JobResized, its partitions' LeaderEpochStarted; commands the agents",
            # rally-secrets: reads a job's secrets into its launches, purges them once the job has ended;
            # rally-partitions: its replicas' presence and partition leases, each partition's epoch
            publish=(
                f"rally.ctl.job.{one}",
                f"rally.ctl.epoch.{one}",
                "cmd.agent.>",
                *job_secrets(),
                *partition_keys(subjects.CONTROL_ROLE),
            ),
        ),
        # its leader lease: one replica projects, the others stand by (projection.standby)
        "projector": _service(writes="nothing (PostgreSQL read models)", publish=leader_lease("projector")),
        "predictor": _service(writes="nothing (answers q.predictor.starts)", serves=True),
    }
    for role in SNAPSHOT_ROLES:
        roles[role] = _with_snapshots(roles[role], role)
    # Only who answers queries may respond (``allow_responses``): nats-server records the reply subject of
    # every message such an identity receives, each event its follow delivers included (its ``$JS.ACK``
    # subject), and keeps it two minutes, walking the whole record to prune it: ~400,000 entries per
    # connection at 3,000 events/s, a tenth of the server's CPU with nine followers.
    serving = {role for role, perms in roles.items() if perms.allow_responses}
    subscriptions = {role: _queries(role) if role in serving else () for role in roles if role != ADMIN}
    subscriptions["health-monitor"] = (subjects.HEARTBEATS,)  # heard, never answered
    # it asks, it answers nothing; it reads the agents' terminal output (interactive sessions)
    subscriptions["api"] = (subjects.TERMINALS,)
    for role, extra in subscriptions.items():
        roles[role] = _with_subscriptions(roles[role], own_inboxes(role), *extra)
    return roles


MATRIX: dict[str, Permissions] = _matrix()
#: Every identity but the per-node agents, in the order the configs list them.
ROLES: tuple[str, ...] = tuple(MATRIX)
SERVICE_ROLES: tuple[str, ...] = tuple(role for role in MATRIX if role != ADMIN)


def permissions(role: str) -> Permissions:
    """The permissions of a service role or ``admin`` (KeyError for anything else)."""
    return MATRIX[role]


def agent_user(node_id: str) -> str:
    """The NATS user of one node's agent."""
    if not subjects.TOKEN_PATTERN.match(node_id):
        raise ValueError(f"not a valid node id: {node_id!r}")
    return f"{AGENT}-{node_id}"


def agent_permissions(node_id: str) -> Permissions:
    """A node agent: heartbeats, NodeRegistered, RankExited and CheckpointCommitted for its node only."""
    return Permissions(
        publish=(
            subjects.heartbeat(node_id),
            subjects.node_registration(node_id),
            subjects.agent_tree(node_id),
            subjects.terminal_tree(node_id),  # its interactive ranks' terminals (agent.terminal)
            *LOG,
        ),
        subscribe=(own_inboxes(agent_user(node_id)), f"cmd.agent.{node_id}.>"),
        allow_responses=True,
        writes="NodeRegistered, RankExited, CheckpointCommitted for its own node; heartbeats; "
        "its interactive ranks' terminal output",
    )
