"""`rally tokens create | list | revoke`: manage the API's bearer tokens.

An administrator's tool, run on the API host (or wherever the token file is mounted from): it edits the
file the API reads (``rallypoint.security.tokens``) directly, and the API picks up the change on its next
request. It never talks to the API, so it works before the first token exists. The file is found by
``--tokens-file``, else ``$RALLY_TOKENS_FILE``, else the local cluster's (``.rally/cluster.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from rallypoint.security.tokens import TokenError, TokenRecord, create_token, read_tokens, revoke_token

from .clusterinfo import cluster_info
from .output import add_output_args, wants_json

TOKENS_FILE_ENV = "RALLY_TOKENS_FILE"


def resolve_tokens_file(explicit: str | None) -> Path | None:
    if explicit:
        return Path(explicit)
    if os.environ.get(TOKENS_FILE_ENV):
        return Path(os.environ[TOKENS_FILE_ENV])
    local = cluster_info().get("tokens_file")
    return Path(local) if isinstance(local, str) and local else None


def _with_file(action: Callable[[argparse.Namespace, Path], int]) -> Callable[[argparse.Namespace], int]:
    """A command on the token file: finds it, and turns a ``TokenError`` into one line and exit 2."""

    def command(args: argparse.Namespace) -> int:
        path = resolve_tokens_file(args.tokens_file)
        if path is None:
            print(
                f"error: no token file: pass --tokens-file, set ${TOKENS_FILE_ENV}, or run in the folder of "
                "`rally up`",
                file=sys.stderr,
            )
            return 2
        try:
            return action(args, path)
        except TokenError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return command


@_with_file
def cmd_create(args: argparse.Namespace, path: Path) -> int:
    user = args.user or ("admin" if args.admin else args.team)
    record, token = create_token(path, user=user, team=args.team, admin=args.admin)
    who = "admin" if args.admin else f"team {record.team}"
    # The token alone on stdout, so `export RALLY_TOKEN=$(rally tokens create ...)` works.
    print(f"created {record.id} ({who}, user {record.user}); the token is shown only now:", file=sys.stderr)
    print(json.dumps({**_public(record), "token": token}, indent=2) if wants_json(args) else token)
    return 0


@_with_file
def cmd_list(args: argparse.Namespace, path: Path) -> int:
    records = read_tokens(path).tokens
    if wants_json(args):
        print(json.dumps([_public(r) for r in records], indent=2))
        return 0
    print(f"{'ID':<12}{'ROLE':<7}{'TEAM':<16}{'USER':<20}{'CREATED':<21}REVOKED")
    for r in records:
        revoked = _when(r.revoked_at) if r.revoked_at is not None else "-"
        print(f"{r.id:<12}{r.role:<7}{r.team or '-':<16}{r.user:<20}{_when(r.created_at):<21}{revoked}")
    return 0


@_with_file
def cmd_revoke(args: argparse.Namespace, path: Path) -> int:
    record = revoke_token(path, args.token_id)
    if wants_json(args):
        print(json.dumps(_public(record), indent=2))
        return 0
    print(f"revoked {record.id} (user {record.user}); the API refuses it from its next request")
    return 0


def _public(record: TokenRecord) -> dict[str, object]:
    """A record without its hash: output is for reading, not for copying verifiers around."""
    return {k: v for k, v in msgspec.to_builtins(record).items() if k != "hash"}


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + "Z"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    tokens = subparsers.add_parser(
        "tokens",
        help="create, list and revoke API tokens (edits the API's token file)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = tokens.add_subparsers(dest="tokens_command", metavar="ACTION")
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--tokens-file",
        default=None,
        help=f"the API's token file (default ${TOKENS_FILE_ENV}, then the local cluster's)",
    )
    add_output_args(common)
    create = sub.add_parser("create", parents=[common], help="make a token; printed once")
    owner = create.add_mutually_exclusive_group(required=True)
    owner.add_argument("--team", help="the team the token acts for")
    owner.add_argument("--admin", action="store_true", help="an admin token: every team, every job")
    create.add_argument(
        "--user", help="who holds it, recorded on what it submits or cancels (default: the team)"
    )
    create.set_defaults(func=cmd_create)
    listing = sub.add_parser("list", parents=[common], help="every token, revoked ones included (no secrets)")
    listing.set_defaults(func=cmd_list)
    revoke = sub.add_parser("revoke", parents=[common], help="revoke a token by its id (rally tokens list)")
    revoke.add_argument("token_id", metavar="ID")
    revoke.set_defaults(func=cmd_revoke)
