"""``rally nodes drain|undrain NODE --reason TEXT``: an operator takes a node out of service or returns it
(admin token only; POST /v1/nodes/{node}/drain and /undrain, docs/health.md "Operator drain")."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from collections.abc import Callable

from .client import ApiClient, ApiError, ApiUnreachable, resolve_api_url
from .output import add_output_args, wants_json

EXIT_OK = 0
EXIT_ERROR = 2

_HELP = {
    "drain": "stop placing new work on a node, like scontrol update state=drain (jobs running on it are "
    "interrupted and repaired on other nodes: docs/health.md)",
    "undrain": "return a drained node to service, like scontrol update state=resume",
}


def add_node_action_parsers(
    nodes: argparse.ArgumentParser, api_arg: Callable[[argparse.ArgumentParser], None]
) -> None:
    actions = nodes.add_subparsers(dest="node_action", metavar="{drain,undrain}")
    for action, help_text in _HELP.items():
        parser = actions.add_parser(action, help=help_text, description=help_text)
        parser.add_argument("node_id", metavar="NODE")
        parser.add_argument("--reason", required=True, help="why (recorded in the event log with your user)")
        add_output_args(parser)
        api_arg(parser)
        parser.set_defaults(func=cmd_node_action, action=action)


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
    status = node.get("status", "?")
    if args.action == "drain":
        jobs = node.get("jobs") or []
        running = (
            f"; the job controller interrupts its {len(jobs)} job(s) and repairs them on other nodes: "
            + ", ".join(jobs)
            if jobs
            else ""
        )
        print(f"node {args.node_id} drained ({args.reason}): no new work will be placed on it{running}")
    else:
        print(f"node {args.node_id} is {status}: back in service")
    return EXIT_OK
