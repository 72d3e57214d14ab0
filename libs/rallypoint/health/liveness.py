"""The health monitor's silence decisions: when each node was last heard in, the few node events that matter
out (unreachable, lost, recovered). What the heartbeats *say* (GPU and NIC signals, step times) is judged by
``detection`` through ``judge``.

Pure: the shell passes the folded node views, when it last heard each node, what it knows of its own
link to the bus (``Hearing``) and ``now``. Heartbeats themselves never enter the log (2,500/s of samples
would drown it); only state changes do.

An outage is not a massacre. Silence proves something only when the monitor can hear, so:

1. **Deaf: no verdict.** While the monitor is not connected to NATS it decides nothing.
2. **Grace after hearing again.** ``Hearing.since`` is when the monitor last (re)gained the bus: its start,
   its last reconnect, the end of a mass silence. Every node's silence counts from then at the earliest,
   so each gets a full unreachable/lost timeout before a verdict (its agent may reconnect later than we do).
3. **Mass silence: suspect the observer.** A node silent for ``quiet_after_s`` (half the unreachable
   timeout by default, so the rule fires before the first verdict could) is *quiet*. When more than
   ``mass_silence_fraction`` of the watched nodes (up or unreachable), and at least
   ``mass_silence_min_nodes``, went quiet within ``mass_silence_window_s`` of each other, the likelier
   cause is the monitor's own link (a partition, a stalled server, its own subscription gone silent: the
   100 % case), not that many machines died in the same seconds: every silence verdict is held, loudly.
   Verdicts that rest on what *was* heard (a node answering again) still go through. A mass
   silence that lasts ``mass_silence_max_hold_s`` (10 lost timeouts by default) while the monitor is
   connected is believed: a rack that lost power stays dead, and its gangs must be replaced eventually.
4. **Judged as of what was read.** A monitor short of CPU reads the heartbeats late; while that delay grows,
   the heartbeats a node sent wait unread and the node looks silent. ``Hearing.behind_s`` (``readlag``:
   how far behind the heartbeats it handles last are, beyond each node's usual delay) moves the moment
   silence is judged at back by as much, so a backlog of the monitor's own flags no node; a node that
   really fell silent is flagged that much later.
"""

from __future__ import annotations

import msgspec

from rallypoint.events import Event, NodeHeartbeatLost, NodeLost, NodeRecovered
from rallypoint.state import NodeView

# XIDs that mean the GPU or its memory is no longer trustworthy (NVIDIA's "reset or replace" class).
FATAL_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95})


class HealthPolicy(msgspec.Struct, frozen=True, kw_only=True):
    unreachable_after_s: float = 5.0
    lost_after_s: float = 30.0
    #: Silent this long: quiet (counted for the mass-silence rule); None: half of ``unreachable_after_s``.
    quiet_after_s: float | None = None
    mass_silence_fraction: float = 0.5
    mass_silence_min_nodes: int = 2
    mass_silence_window_s: float = 10.0
    #: None: ten times ``lost_after_s``.
    mass_silence_max_hold_s: float | None = None

    @property
    def quiet_s(self) -> float:
        return self.unreachable_after_s / 2 if self.quiet_after_s is None else self.quiet_after_s

    @property
    def max_hold_s(self) -> float:
        return (
            10 * self.lost_after_s if self.mass_silence_max_hold_s is None else self.mass_silence_max_hold_s
        )


class Hearing(msgspec.Struct, frozen=True, kw_only=True):
    """What the monitor knows of its own link to the bus."""

    connected: bool = True
    #: Since when it has heard the bus without a break: its start, its last reconnect, the end of a hold.
    since: float
    #: How far behind it reads the heartbeats (``readlag``): silence is judged as of ``now`` minus this,
    #: the moment up to which it has read, so its own backlog is not taken for the nodes' silence.
    behind_s: float = 0.0


class MassSilence(msgspec.Struct, frozen=True, kw_only=True):
    """``quiet`` of ``watched`` nodes went quiet between ``first`` and ``last`` (their last heartbeats)."""

    quiet: int
    watched: int
    first: float
    last: float
    node_ids: tuple[str, ...]


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    event: Event
    msg_id: str


class Assessment(msgspec.Struct, frozen=True, kw_only=True):
    """The events to append now, and why silence verdicts are held (empty when they are not)."""

    decisions: tuple[Decision, ...] = ()
    held: str = ""
    mass: MassSilence | None = None


def silence_started(node: NodeView, last_seen: dict[str, float], hearing: Hearing) -> float:
    """When the node's silence counts from: its last heartbeat (its registration if never heard), but never
    before the monitor could hear (the grace after a start or a reconnect)."""
    return max(last_seen.get(node.node_id, node.registered_at), hearing.since)


class _Scan(msgspec.Struct, kw_only=True):
    """One pass over the nodes: how many are watched, which are quiet, which may need a decision."""

    watched: int = 0
    #: (silence start, node id) of the quiet watched nodes, sorted
    quiet: list[tuple[float, str]] = msgspec.field(default_factory=list)
    #: every node but the up ones heard within the unreachable timeout (``_node_decisions`` decides
    #: nothing for those)
    candidates: list[NodeView] = msgspec.field(default_factory=list)


def _scan(
    nodes: list[NodeView], last_seen: dict[str, float], now: float, policy: HealthPolicy, hearing: Hearing
) -> _Scan:
    """What ``mass_silence`` and ``assess`` need of every node, in one pass: run every second over 12,500
    nodes, so ``silence_started`` and the policy's properties are inlined (the same comparisons) and a
    node with nothing to decide costs no call and no string."""
    quiet_s, unreachable, since = policy.quiet_s, policy.unreachable_after_s, hearing.since
    now -= hearing.behind_s  # silence as of what has been read
    watched = 0
    quiet: list[tuple[float, str]] = []
    candidates: list[NodeView] = []
    heard = last_seen.get
    for n in nodes:
        status = n.status
        if status != "up" and status != "unreachable":
            candidates.append(n)
            continue
        watched += 1
        start = heard(n.node_id, n.registered_at)
        start = start if start > since else since  # max(), without a call per node
        if now - start > quiet_s:
            quiet.append((start, n.node_id))
        if status == "unreachable" or now - start > unreachable:
            candidates.append(n)
    quiet.sort()
    return _Scan(watched=watched, quiet=quiet, candidates=candidates)


def mass_silence(
    nodes: list[NodeView], last_seen: dict[str, float], now: float, policy: HealthPolicy, hearing: Hearing
) -> MassSilence | None:
    """The largest group of watched nodes that went quiet within the window of each other, when it is
    large enough to suspect the observer rather than the nodes (None otherwise)."""
    return _mass_silence(_scan(nodes, last_seen, now, policy, hearing), policy)


def _mass_silence(scan: _Scan, policy: HealthPolicy) -> MassSilence | None:
    quiet = scan.quiet
    best: tuple[int, int] = (0, 0)  # [i, j) of the largest run inside one window
    i = 0
    for j in range(len(quiet)):
        while quiet[j][0] - quiet[i][0] > policy.mass_silence_window_s:
            i += 1
        if j + 1 - i > best[1] - best[0]:
            best = (i, j + 1)
    group = quiet[best[0] : best[1]]
    if (
        len(group) < policy.mass_silence_min_nodes
        or len(group) <= policy.mass_silence_fraction * scan.watched
    ):
        return None
    return MassSilence(
        quiet=len(group),
        watched=scan.watched,
        first=group[0][0],
        last=group[-1][0],
        node_ids=tuple(sorted(node_id for _, node_id in group)),
    )


def assess(
    nodes: list[NodeView],
    last_seen: dict[str, float],
    now: float,
    policy: HealthPolicy,
    *,
    hearing: Hearing,
) -> Assessment:
    """Events to append now. ``last_seen`` is when this monitor last heard each node (its own clock)."""
    if not hearing.connected:
        return Assessment(held="this monitor is not connected to NATS: silence proves nothing")
    scan = _scan(nodes, last_seen, now, policy, hearing)
    mass = _mass_silence(scan, policy)
    held = ""
    if mass is not None:
        lasted = now - mass.first
        if lasted <= policy.max_hold_s:
            held = (
                f"{mass.quiet} of {mass.watched} nodes went silent within {mass.last - mass.first:.1f} s of "
                f"each other ({', '.join(mass.node_ids)}): suspecting this monitor's link, not the nodes"
            )
    out: list[Decision] = []
    for node in scan.candidates:
        out += _node_decisions(node, last_seen, now, policy, hearing, hold_silence=bool(held))
    out.sort(key=_by_node)  # at most one decision per node: the order of sorting the nodes first
    return Assessment(decisions=tuple(out), held=held, mass=mass)


def _by_node(decision: Decision) -> str:
    return decision.node_id


def _node_decisions(
    node: NodeView,
    last_seen: dict[str, float],
    now: float,
    policy: HealthPolicy,
    hearing: Hearing,
    *,
    hold_silence: bool,
) -> list[Decision]:
    out: list[Decision] = []
    seen = silence_started(node, last_seen, hearing)
    read_up_to = now - hearing.behind_s
    silent = read_up_to - seen
    incarnation = f"{node.node_id}:{node.agent_instance}"
    heard = last_seen.get(node.node_id)
    if node.status == "up" and silent > policy.unreachable_after_s and not hold_silence:
        out.append(
            Decision(
                node_id=node.node_id,
                event=NodeHeartbeatLost(node_id=node.node_id, last_seen=seen, at=now),
                msg_id=f"{incarnation}:NodeHeartbeatLost:{seen:.0f}",
            )
        )
    elif node.status == "unreachable" and silent > policy.lost_after_s and not hold_silence:
        out.append(
            Decision(
                node_id=node.node_id,
                event=NodeLost(node_id=node.node_id, at=now, reason=f"no heartbeat for {silent:.0f} s"),
                msg_id=f"{incarnation}:NodeLost:{seen:.0f}",
            )
        )
    elif (
        node.status in ("unreachable", "lost")
        and heard is not None
        and now - heard <= policy.unreachable_after_s
    ):
        # A lost node whose agent answers again returns to service by itself; the job controller kills
        # whatever ranks it still runs for attempts that moved on. Only a heartbeat heard counts: a grace
        # period is no evidence that a node is back. Measured from now, not from what was read: a delay
        # that grew since the verdict must not pass the heartbeat heard before it for a new one.
        out.append(
            Decision(
                node_id=node.node_id,
                event=NodeRecovered(node_id=node.node_id, at=now),
                msg_id=f"{incarnation}:NodeRecovered:{heard:.0f}",
            )
        )
    return out
