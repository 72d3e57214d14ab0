"""The drain policy's command-line flags, one definition for every service that reads the policy: the job
controller acts on it and the API shows each draining job's plan from it, so both must be given the same
``--drain-policy`` and ``--drain-checkpoint-wait`` (docs/health.md, "Operator drain")."""

from __future__ import annotations

import argparse

import msgspec

from .drain import DEFAULT_DRAIN_POLICY, DrainPolicy, parse_drain_policy


def add_drain_policy_args(parser: argparse.ArgumentParser) -> None:
    drain = DEFAULT_DRAIN_POLICY
    parser.add_argument(
        "--drain-policy",
        type=_drain_policy,
        default=drain,
        help="what running gangs do when a node under them is drained or cordoned, per priority class: "
        "CLASS=now|checkpoint|finish, comma-separated, * for any other class (default: "
        + ",".join(f"{k}={v}" for k, v in sorted(drain.by_class.items()))
        + f",*={drain.default})",
    )
    parser.add_argument(
        "--drain-checkpoint-wait",
        type=float,
        default=drain.checkpoint_wait_s,
        help="seconds a 'checkpoint' drain waits for the gang's next checkpoint before it evicts anyway",
    )


def drain_policy_from_args(args: argparse.Namespace) -> DrainPolicy:
    """The policy the flags of ``add_drain_policy_args`` describe."""
    policy: DrainPolicy = args.drain_policy
    return msgspec.structs.replace(policy, checkpoint_wait_s=args.drain_checkpoint_wait)


def _drain_policy(text: str) -> DrainPolicy:
    try:
        return parse_drain_policy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
