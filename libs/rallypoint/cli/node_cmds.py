"""``rally nodes drain|undrain NODE --reason TEXT``: an operator takes a node out of service or returns it
(admin token only; POST /v1/nodes/{node}/drain and /undrain, docs/health.md "Operator drain"); ``rally nodes
rules NODE --label K=V --taint K[=V]`` sets its operator labels and taints (PUT /v1/nodes/{node}/rules)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from .client import ApiClient, ApiError, ApiUnreachable, resolve_api_url
from .output import add_output_args, wants_json
from .resources import add_taint_arg, parse_label

EXIT_OK = 0
EXIT_ERROR = 2

_HELP = {
    "drain": "stop placing new work on a node, like scontrol update state=drain (each job running on it "
    "leaves as its priority class's drain policy says: at once, after its next checkpoint or by a "
    "deadline; the command prints which, and `rally nodes` and `rally show` keep saying it: docs/health.md)",
    "undrain": "return a drained node to service, like scontrol update state=resume",
}


def add_node_action_parsers(
    nodes: argparse.ArgumentParser, api_arg: Callable[[argparse.ArgumentParser], None]
) -> None:
    actions = nodes.add_subparsers(dest="node_action", metavar="{drain,undrain,rules}")
    for action, help_text in _HELP.items():
        parser = actions.add_parser(action, help=help_text, description=help_text)
        parser.add_argument("node_id", metavar="NODE")
        parser.add_argument("--reason", required=True, help="why (recorded in the event log with your user)")
        add_output_args(parser)
        api_arg(parser)
        parser.set_defaults(func=cmd_node_action, action=action)
    _add_rules_parser(actions, api_arg)


_RULES_HELP = (
    "set a node's operator labels and taints on top of its agent's, replacing the previous set (none given: "
    "clear them); running jobs stay, new placements follow them (admin token only)"
)


def _add_rules_parser(actions: Any, api_arg: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = actions.add_parser("rules", help=_RULES_HELP, description=_RULES_HELP)
    parser.add_argument("node_id", metavar="NODE")
    parser.add_argument(
        "--label", type=parse_label, action="append", default=[], metavar="KEY=VALUE", help="repeatable"
    )
    add_taint_arg(parser, "an operator's taint")
    add_output_args(parser)
    api_arg(parser)
    parser.set_defaults(func=cmd_node_rules)


def cmd_node_rules(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    path = f"/v1/nodes/{urllib.parse.quote(args.node_id, safe='')}/rules"
    try:
        body = client.request("PUT", path, body={"labels": dict(args.label), "taints": list(args.taint)}).body
    except ApiError as err:
        print(f"error: cannot set the rules of node {args.node_id}: {err.detail}", file=sys.stderr)
        return EXIT_ERROR
    except ApiUnreachable as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    if wants_json(args):
        print(json.dumps(body, indent=2))
        return EXIT_OK
    node = body.get("node") or {}
    labels = ",".join(f"{k}={v}" for k, v in sorted((node.get("labels") or {}).items())) or "none"
    taints = ",".join(node.get("taints") or []) or "none"
    print(f"node {args.node_id}: labels {labels}; taints {taints}")
    return EXIT_OK


def cmd_node_action(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    path = f"/v1/nodes/{urllib.parse.quote(args.node_id, safe='')}/{args.action}"
    try:
        body = client.request("POST", path, body={"reason": args.reason}).body
    except ApiError as err:
        print(f"error: cannot {args.action} node {args.node_id}: {err.detail}", file=sys.stderr)
        return EXIT_ERROR
    except ApiUnreachable as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    if wants_json(args):  # the API's answer: the node as it now stands
        print(json.dumps(body, indent=2))
        return EXIT_OK
    node = body.get("node") or {}
    if args.action == "drain":
        print(drain_text(args.node_id, args.reason, node, now=time.time()))
    else:
        print(f"node {args.node_id} is {node.get('status', '?')}: back in service")
    return EXIT_OK


def drain_text(node_id: str, reason: str, node: Mapping[str, Any], *, now: float) -> str:
    """What the drain did and what happens to each job on the node, and when, as the API planned it."""
    head = f"node {node_id} drained ({reason}): no new work will be placed on it"
    plans = node.get("draining_jobs") or []
    if not plans:
        return head + "; no job runs on it"
    lines = [head + f"; its {len(plans)} job(s) leave it and are repaired on other nodes:"]
    lines.extend(f"  {p['job_id']}: {plan_text(p, now=now)}" for p in plans)
    return "\n".join(lines)


def plan_text(plan: Mapping[str, Any], *, now: float) -> str:
    """One job's drain plan in words: ``interrupted now``, ``after its next checkpoint, by 10:32:05 (in
    29m58s)``, ``at 10:32:05 (in 29m58s)``, ``left to run to its end``; then the API's detail."""
    deadline = plan.get("deadline")
    kind = plan.get("plan")
    if kind == "now" or (deadline is not None and deadline <= now):
        when = "interrupted now"
    elif deadline is None:
        when = "left to run to its end"
    elif kind == "after-checkpoint":
        when = f"interrupted after its next checkpoint, at the latest {_at(deadline, now)}"
    else:
        when = f"interrupted {_at(deadline, now)}"
    detail = plan.get("detail")
    return f"{when} ({detail})" if detail else when


def _at(deadline: float, now: float) -> str:
    clock = time.strftime("%H:%M:%S", time.localtime(deadline))
    return f"at {clock} (in {_duration(deadline - now)})"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(max(0, int(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
