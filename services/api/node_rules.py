"""An operator's labels and taints for a node: PUT /v1/nodes/{node_id}/rules (admin tokens only).

The body ``{"labels": {"zone": "a"}, "taints": ["dedicated=inference"]}`` replaces the operator's previous
set (an empty body clears it); the node's effective labels and taints are its agent's with these on top
(``NodeRulesSet``, ``state.cluster``). Running jobs stay where they are: rules decide new placements only
(a drain moves jobs off a node). The write is fenced on the node's subjects as a drain is (``node_ops``).
"""

from __future__ import annotations

import time

import msgspec
from aiohttp import web

from rallypoint.eventlog import AppendConflict, EventLog, LogUnavailable
from rallypoint.events import NodeRulesSet, subjects
from rallypoint.events.subjects import TOKEN_PATTERN
from rallypoint.jobs.placement_rules import check_labels, check_taints
from rallypoint.jobs.text import SpecError
from rallypoint.jobs.validate import BodyError, decode_json_body

from .auth import forbidden, principal
from .fold import FoldFollower
from .node_ops import append_fenced
from .problems import not_found, problem, unavailable, unparseable
from .views import Audience, render_node

ATTEMPTS = 3  # a conflict means the node's state moved: append again on the newer view, a few times
_json = msgspec.json.Encoder()


def _rules(raw: bytes) -> tuple[dict[str, str], tuple[str, ...]]:
    """The body's labels and taints; ``BodyError`` / ``SpecError`` naming the field otherwise."""
    body = decode_json_body(raw)
    if not isinstance(body, dict):
        raise SpecError("body", 'must be an object {"labels": {...}, "taints": [...]}')
    unknown = sorted(str(key) for key in body if key not in ("labels", "taints"))
    if unknown:
        raise SpecError(unknown[0], "unknown field (labels and taints are known)")
    return check_labels(body.get("labels"), "labels"), check_taints(body.get("taints"), "taints")


class NodeRules:
    def __init__(self, log: EventLog, follower: FoldFollower, source: str, fold_wait_s: float) -> None:
        self.log = log
        self.follower = follower
        self.source = source
        self.fold_wait_s = fold_wait_s

    async def put(self, request: web.Request) -> web.Response:
        who = principal(request)
        if not who.admin:
            return forbidden(
                f"only an admin token may set a node's rules; this token acts for team {who.team!r}"
            )
        try:
            labels, taints = _rules(await request.read())
        except BodyError as err:
            return unparseable(err.detail, field=err.field)
        except SpecError as err:
            return problem(422, "Invalid request", err.detail, slug="invalid-spec", field=err.field)
        node_id = request.match_info["node_id"]
        if not TOKEN_PATTERN.match(node_id):
            return not_found("node", node_id)
        facts = subjects.node_facts(node_id)
        try:
            for _ in range(ATTEMPTS):
                last = await self.log.last_seq(facts)
                if not await self.follower.wait_for_seq(last, self.fold_wait_s):
                    return unavailable(f"this API's view of the log has not reached seq {last}; retry")
                if node_id not in self.follower.state.nodes:
                    return not_found("node", node_id)
                event = NodeRulesSet(
                    node_id=node_id, labels=labels, taints=taints, set_by=who.user, at=time.time()
                )
                try:
                    seq = await append_fenced(self.log, event, f"{node_id}:rules:{last}", self.source, last)
                except AppendConflict:
                    continue  # another fact about the node landed first: append on the newer view
                await self.follower.wait_for_seq(seq, self.fold_wait_s)
                node = self.follower.state.nodes[node_id]
                body = {"node": render_node(node, Audience(None, self.follower.state.jobs)), "seq": seq}
                return web.Response(status=200, body=_json.encode(body), content_type="application/json")
        except LogUnavailable as exc:
            return unavailable(f"the event log did not acknowledge the rules ({exc}); retry")
        return unavailable(f"node {node_id}'s state kept changing; retry")


def add_node_rules_route(
    app: web.Application, log: EventLog, follower: FoldFollower, source: str, wait: float
) -> None:
    app.router.add_put("/v1/nodes/{node_id}/rules", NodeRules(log, follower, source, wait).put)
