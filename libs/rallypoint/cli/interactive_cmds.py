"""`rally run --pty` and `rally attach`: an interactive shell on a job's rank, as `srun --pty bash`.

``rally run --gpus 1 --pty -- bash`` submits a job of kind ``interactive`` (its own priority class, ahead of
standard training), waits until it runs, then relays this terminal to its rank through the API
(``rallypoint.interactive.client``). It exits with the shell's exit status. Ctrl-C while it waits cancels
the job (as ``srun`` gives its allocation back); once the shell runs, Ctrl-C is the shell's.

If the connection is lost the job keeps its terminal for the team's disconnect grace (a minute unless the
queue file says otherwise): ``rally attach JOB`` reaches it again.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from .client import ApiClient, ApiError, ApiUnreachable, resolve_api_url
from .jobs_cmds import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_JOB_ENDED_WITHOUT_CODE,
    EXIT_OK,
    TERMINAL_STATES,
    _answer,
    _api_arg,
    default_name,
    describe,
    flag_error,
    parse_duration,
    parse_env,
)
from .resources import parse_gpu_fraction, parse_label

if TYPE_CHECKING:
    from rallypoint.interactive.client import HandshakeRefused


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run",
        help="run an interactive shell on GPUs (like srun --pty bash)",
        description="Start an interactive job and attach this terminal to it: "
        "`rally run --gpus 1 --pty -- bash`. Exits with the shell's exit status.",
    )
    run.add_argument("--gpus", type=int, help="GPUs (default 1)")
    run.add_argument(
        "--gpu-fraction",
        type=parse_gpu_fraction,
        dest="gpu_milli",
        metavar="F",
        help="a share of one GPU (0.25 or 25%%) instead of whole GPUs",
    )
    run.add_argument("--mig", dest="mig_profile", metavar="PROFILE", help="a MIG slice of this profile")
    run.add_argument("--pty", action="store_true", help="give the command a terminal (required for now)")
    run.add_argument("--team", default=os.environ.get("RALLY_TEAM"), help="team (default: the token's)")
    run.add_argument("--name", help="job name (default: derived from the command)")
    run.add_argument("--priority", help="priority class (default: the cluster's interactive class)")
    run.add_argument("--time-limit", type=parse_duration, help="wall-clock limit: 3600, 90m, 2h")
    run.add_argument("--gpu-type", help="only nodes with this GPU type")
    run.add_argument("--node-selector", type=parse_label, action="append", default=[], metavar="KEY=VALUE")
    run.add_argument("--env", type=parse_env, action="append", default=[], metavar="NAME=VALUE")
    run.add_argument(
        "--port",
        type=int,
        action="append",
        default=[],
        dest="ports",
        metavar="PORT",
        help="publish this port of the job (a notebook's 8888) and forward localhost:PORT to it while "
        "attached (repeatable); `rally port-forward` reaches it from elsewhere",
    )
    run.add_argument("--poll-interval", type=float, default=0.5, help=argparse.SUPPRESS)
    _api_arg(run)
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- the program (bash)")
    run.set_defaults(func=cmd_run)

    attach = subparsers.add_parser(
        "attach",
        help="attach this terminal to a running interactive job again",
        description="Reach a running interactive job's terminal again (after a lost connection, within "
        "the disconnect grace). A session attached elsewhere is taken over.",
    )
    attach.add_argument("job_id")
    attach.add_argument("--rank", type=int, default=0, help="which rank's terminal (default 0)")
    _api_arg(attach)
    attach.set_defaults(func=cmd_attach)

    forward = subparsers.add_parser(
        "port-forward",
        help="reach a port a running job publishes from this machine (like kubectl port-forward)",
        description="Listen on localhost:LOCAL (default PORT) and relay each connection to the job's PORT "
        "through the API (the job must publish it: rally run --port, or ports in its spec). Until Ctrl-C.",
    )
    forward.add_argument("job_id")
    forward.add_argument("port", type=int)
    forward.add_argument("--local-port", type=int, help="the local port (default: the same)")
    forward.add_argument("--rank", type=int, default=0, help="whose node (default rank 0's)")
    _api_arg(forward)
    forward.set_defaults(func=cmd_port_forward)


def run_body(args: argparse.Namespace) -> dict[str, Any]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    body: dict[str, Any] = {
        "name": args.name or default_name(command),
        "gpus": args.gpus if args.gpus is not None else 1,
        "command": command,
        "kind": "interactive",
    }
    optional = {
        "team": args.team,
        "priority": args.priority,
        "time_limit_s": args.time_limit,
        "gpu_type": args.gpu_type,
        "gpu_milli": args.gpu_milli,
        "mig_profile": args.mig_profile,
        "node_selector": dict(args.node_selector) or None,
        "env": dict(args.env) or None,
        "ports": list(args.ports) or None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def cmd_run(args: argparse.Namespace) -> int:
    if not args.pty:
        print(
            "error: --pty: rally run starts a terminal session; for a batch job use rally submit",
            file=sys.stderr,
        )
        return EXIT_ERROR
    body = run_body(args)
    if not body["command"]:
        print("error: command: is required, after `--` (rally run --gpus 1 --pty -- bash)", file=sys.stderr)
        return EXIT_ERROR
    client = ApiClient(resolve_api_url(args.api_url))
    resp = _answer(lambda: client.submit(body))
    if resp is None:
        return EXIT_ERROR
    job_id = str(resp.body["job_id"])
    print(f"rally: job {job_id} submitted; waiting for it to start", file=sys.stderr, flush=True)
    try:
        job = _wait_running(client, job_id, args.poll_interval)
    except KeyboardInterrupt:
        _cancel_quietly(client, job_id)
        print(f"\nrally: cancelled {job_id}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ApiError, ApiUnreachable) as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    if job["state"] != "running":
        print(f"rally: {job_id} {describe(job)}", file=sys.stderr)
        return EXIT_JOB_ENDED_WITHOUT_CODE
    return _attach(client, job_id, 0, ports=args.ports)


def cmd_attach(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    return _attach(client, args.job_id, args.rank)


def _wait_running(client: ApiClient, job_id: str, poll_s: float) -> dict[str, Any]:
    """The job once it runs, or once it ended without running; says on stderr why it waits, as srun's
    "job queued and waiting for resources" does, each time that changes."""
    said = ""
    while True:
        job = client.get_job(job_id)
        if job["state"] == "running" or job["state"] in TERMINAL_STATES:
            return job
        if job.get("pending_reason") and (line := describe(job)) != said:
            print(f"rally: {job_id} {line}", file=sys.stderr, flush=True)
            said = line
        time.sleep(poll_s)


def _cancel_quietly(client: ApiClient, job_id: str) -> None:
    try:
        client.cancel(job_id)
    except (ApiError, ApiUnreachable) as err:
        print(err.line(), file=sys.stderr)


def cmd_port_forward(args: argparse.Namespace) -> int:
    import asyncio

    from rallypoint.interactive.client import forward

    client = ApiClient(resolve_api_url(args.api_url))
    try:
        job = client.get_job(args.job_id)
    except (ApiError, ApiUnreachable) as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    if args.port not in job["spec"].get("ports", []):
        published = ", ".join(map(str, job["spec"].get("ports", []))) or "none"
        print(
            f"error: {args.job_id} does not publish port {args.port} (its ports: {published})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    local = args.local_port or args.port
    print(
        f"rally: localhost:{local} reaches port {args.port} of {args.job_id}; Ctrl-C stops", file=sys.stderr
    )
    # Ctrl-C (SIGINT) stops it however it was started: one started in the background by a script inherits
    # SIGINT as ignored, which Python keeps, and asyncio then installs no handler (as `rally up` does).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(forward(client.base_url, client.token, args.job_id, args.port, local, args.rank))
    except KeyboardInterrupt:
        return EXIT_OK
    except OSError as err:
        print(f"error: cannot listen on localhost:{local}: {err}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


#: Handshakes refused by the rank's agent (502: it refused; 503: it did not answer in time) are tried this
#: many times in all, the waits between them doubling from ``ATTACH_RETRY_S``: on a loaded node a rank
#: that has just started may not be served at once.
ATTACH_TRIES = 4
ATTACH_RETRY_S = 0.5
_AGENT_REFUSALS = frozenset({502, 503})


def _attach(client: ApiClient, job_id: str, rank: int, ports: list[int] | None = None) -> int:
    from rallypoint.interactive.client import HandshakeRefused, run

    for attempt in range(ATTACH_TRIES):
        try:
            ending = run(client.base_url, client.token, job_id, rank, ports or ())
            break
        except HandshakeRefused as err:
            if err.status in _AGENT_REFUSALS and attempt + 1 < ATTACH_TRIES:
                time.sleep(ATTACH_RETRY_S * 2**attempt)
                continue
            print(flag_error(None, _refusal(client, job_id, err)), file=sys.stderr)
            return EXIT_ERROR
        except OSError as err:
            print(f"error: cannot reach the terminal of {job_id}: {err}", file=sys.stderr)
            return EXIT_ERROR
    if ending.status is not None:
        return ending.status if 0 <= ending.status < 256 else EXIT_JOB_ENDED_WITHOUT_CODE
    if ending.lost:
        print(f"\r\nrally: connection lost; `rally attach {job_id}` reaches the shell again", file=sys.stderr)
        return EXIT_ERROR
    print(f"\r\nrally: session closed: {ending.reason}", file=sys.stderr)
    if _still_running(client, job_id):
        print(f"rally: {job_id} goes on; `rally attach {job_id}` reaches it again", file=sys.stderr)
    return EXIT_JOB_ENDED_WITHOUT_CODE


def _still_running(client: ApiClient, job_id: str) -> bool:
    try:
        job = client.get_job(job_id)
        return job.get("state") == "running" and not job.get("cancel_requested")
    except (ApiError, ApiUnreachable):
        return False


def _refusal(client: ApiClient, job_id: str, err: HandshakeRefused) -> str:
    """Why the API refused the terminal, in its words (a WebSocket handshake carries no body: ask again
    over plain HTTP, which answers the same problem). Not for the agent's refusals: those come after the
    checks a plain request gets through, which then only hears that it is no WebSocket."""
    if err.status in _AGENT_REFUSALS:
        return (
            f"the agent of {job_id}'s node did not open its terminal (HTTP {err.status}: {err.detail}); "
            f"`rally attach {job_id}` tries again"
        )
    try:
        client.request("GET", f"/v1/jobs/{job_id}/terminal")
    except ApiError as refused:
        return refused.detail
    except ApiUnreachable as unreachable:
        return unreachable.line()
    return str(err)
