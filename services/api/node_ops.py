"""Operator drain and undrain: POST /v1/nodes/{node_id}/drain and /undrain (admin tokens only).

A drain stops new work on the node (the scheduler places only on ``NodeView.schedulable`` nodes: status
``up`` and health not degraded or failed). Gangs running on it leave as their priority class's drain
policy says (``control/drain.py``: at once, after their next checkpoint, or when they finish); the job
controller stops such a gang and repairs it on other nodes from its last checkpoint, spending no user
retry. An undrain returns a drained node to service whoever drained it, and clears a health verdict
(a node cordoned as degraded, or drained as failed: a hard fault waits for an operator); undrain of a
node in service and healthy changes nothing (200, ``changed`` false); of a node lost or unreachable is
refused with 409.

Each write is fenced on the node's subject (``rally.node.<id>``): the API reads the subject's last
sequence, waits for its fold to reach it, decides on that node view and appends with that sequence as
the expected one. A health verdict (``NodeLost``) landing in between makes the append conflict, and the
request is decided again on the newer view rather than overwriting it.
"""

from __future__ import annotations

import time
from typing import Literal

import msgspec
from aiohttp import web

from rallypoint.control.drain import DEFAULT_DRAIN_POLICY, DrainPolicy
from rallypoint.eventlog import AppendConflict, EventLog, LogUnavailable
from rallypoint.events import NodeDrained, NodeEvent, NodeUndrained, subjects
from rallypoint.events.subjects import TOKEN_PATTERN
from rallypoint.jobs.text import SpecError, check_strings
from rallypoint.jobs.validate import BodyError, decode_json_body
from rallypoint.state import NodeView

from .auth import forbidden, principal
from .fold import FoldFollower
from .problems import not_found, problem, unavailable, unparseable
from .views import Audience, render_node

Action = Literal["drain", "undrain"]
MAX_REASON = 1_000
ATTEMPTS = 3  # a conflict means the node's state moved: decide again on the newer view, a few times

_json = msgspec.json.Encoder()


#: What makes a reason blank, exactly the characters the OpenAPI pattern names (Python's ``str.strip()``
#: also strips control characters such as \x1f, which JSON Schema's ``\S`` does not count as space).
BLANK = " \t\n\r\x0b\x0c"


def _reason(raw: bytes) -> tuple[str | None, web.Response | None]:
    try:
        body = decode_json_body(raw)
        # The reason is free text (a tab or a newline may stay); every other string is held to one line.
        check_strings(body, free_text={"reason"})
    except BodyError as err:
        return None, unparseable(err.detail, field=err.field)
    except SpecError as err:
        return None, _invalid(err.detail, field=err.field)
    if isinstance(body, dict) and (unknown := sorted(str(key) for key in body if key != "reason")):
        return None, _invalid(f"unknown field {unknown[0]!r}: the body holds a reason only", field=unknown[0])
    reason = body.get("reason") if isinstance(body, dict) else None
    if not isinstance(reason, str) or not reason.strip(BLANK):
        return None, _invalid(
            'a reason is required: send {"reason": "why"} (it is recorded in the event log)'
        )
    if len(reason) > MAX_REASON:
        return None, _invalid(f"reason must be at most {MAX_REASON} characters")
    return reason.strip(BLANK), None


def _invalid(detail: str, *, field: str = "reason") -> web.Response:
    return problem(422, "Invalid request", detail, slug="invalid-spec", field=field)


class NodeOps:
    def __init__(
        self,
        log: EventLog,
        follower: FoldFollower,
        source: str,
        fold_wait_s: float,
        drain: DrainPolicy = DEFAULT_DRAIN_POLICY,
    ) -> None:
        self.log = log
        self.follower = follower
        self.source = source
        self.fold_wait_s = fold_wait_s
        self.drain_policy = drain

    async def drain(self, request: web.Request) -> web.Response:
        return await self._act(request, "drain")

    async def undrain(self, request: web.Request) -> web.Response:
        return await self._act(request, "undrain")

    async def _act(self, request: web.Request, action: Action) -> web.Response:
        who = principal(request)
        if not who.admin:
            return forbidden(
                f"only an admin token may {action} a node; this token acts for team {who.team!r}"
            )
        reason, refused = _reason(await request.read())
        if refused is not None or reason is None:
            return refused or unparseable("no reason")
        node_id = request.match_info["node_id"]
        if not TOKEN_PATTERN.match(node_id):
            return not_found("node", node_id)
        if who.user == subjects.HEALTH_MONITOR:
            return forbidden(f"user {who.user!r} is the health monitor's name: act under your own user")
        facts = subjects.node_facts(node_id)
        try:
            for _ in range(ATTEMPTS):
                last = await self.log.last_seq(facts)
                if not await self.follower.wait_for_seq(last, self.fold_wait_s):
                    return unavailable(f"this API's view of the log has not reached seq {last}; retry")
                node = self.follower.state.nodes.get(node_id)
                if node is None:
                    return not_found("node", node_id)
                if action == "drain" and node.status == "lost":
                    return _conflict(
                        node_id, node.status, node.status_reason, "a lost node cannot be drained"
                    )
                if action == "undrain" and node.status == "up" and not node.cordoned:
                    # already in service: nothing to append
                    return self._done(node, last, action, changed=False)
                if action == "undrain" and node.status not in ("drained", "up"):
                    return _conflict(
                        node_id,
                        node.status,
                        node.status_reason,
                        "only a drained or cordoned node can be undrained",
                    )
                now = time.time()
                event: NodeDrained | NodeUndrained = (
                    NodeDrained(node_id=node_id, reason=reason, at=now, drained_by=who.user)
                    if action == "drain"
                    else NodeUndrained(node_id=node_id, reason=reason, undrained_by=who.user, at=now)
                )
                try:
                    seq = await append_fenced(
                        self.log, event, f"{node_id}:{action}:{last}", self.source, last
                    )
                except AppendConflict:
                    continue  # a health verdict or another operator got there first: decide again
                await self.follower.wait_for_seq(seq, self.fold_wait_s)
                current = self.follower.state.nodes.get(node_id, node)
                return self._done(current, seq, action, changed=True)
        except LogUnavailable as exc:
            return unavailable(f"the event log did not acknowledge the {action} ({exc}); retry")
        return unavailable(f"node {node_id}'s state kept changing during the {action}; retry")

    def _done(self, node: NodeView, seq: int, action: Action, *, changed: bool) -> web.Response:
        """The node as it now stands, with each of its jobs' drain plans (an admin sees every job)."""
        admin = Audience(None, self.follower.state.jobs)
        body = {
            "node": render_node(node, admin, self.drain_policy),
            "seq": seq,
            "action": action,
            "changed": changed,
        }
        return web.Response(status=200, body=_json.encode(body), content_type="application/json")


async def append_fenced(log: EventLog, event: NodeEvent, msg_id: str, source: str, last: int) -> int:
    """Append an operator's ``event`` on its node's operator subject, fenced on every fact about the node:
    ``AppendConflict`` when any landed after ``last`` (the caller decides again on the newer view)."""
    return await log.append(
        subjects.for_event(event),
        event,
        msg_id=msg_id,
        source=source,
        expected_last_subject_seq=last,
        expected_subject_filter=subjects.node_facts(event.node_id),
    )


def _conflict(node_id: str, status: str, why: str, detail: str) -> web.Response:
    because = f" ({why})" if why else ""
    return problem(
        409,
        "Node state conflict",
        f"node {node_id} is {status}{because}: {detail}",
        slug="node-state",
        node_id=node_id,
        node_status=status,
    )


def add_node_routes(
    app: web.Application,
    log: EventLog,
    follower: FoldFollower,
    source: str,
    wait: float,
    drain: DrainPolicy = DEFAULT_DRAIN_POLICY,
) -> None:
    ops = NodeOps(log, follower, source, wait, drain)
    app.router.add_post("/v1/nodes/{node_id}/drain", ops.drain)
    app.router.add_post("/v1/nodes/{node_id}/undrain", ops.undrain)
