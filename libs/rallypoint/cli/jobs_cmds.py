"""`rally submit | jobs | nodes | cancel`: the user's side of the HTTP API.

Output follows Slurm's habits (``squeue`` columns, a bare job id from ``submit``) because that is what
our users' scripts and fingers already know. Every failure is one line on stderr: ``error: ...``.
Exit codes: 0 ok; 2 the request was refused or could not be made; 130 interrupted; 1 a dry run
(``submit --dry-run``) the cluster would refuse (not admitted, or rejected by the scheduler). With --wait,
the job's own exit code when it failed with one (as srun passes it through), and 125 when it ended without
one (cancelled, rejected, failed by the cluster: a time limit, lost ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rallypoint.jobs import PRIORITY_CLASSES, TOPOLOGY_LEVELS, SpecError, validate_spec
from rallypoint.jobs.arrays import parse_array

from .client import ApiClient, ApiError, ApiUnreachable, Response, resolve_api_url
from .node_cmds import add_node_action_parsers
from .output import add_output_args, wants_json
from .resources import (
    parse_affinity,
    parse_anti_affinity,
    parse_cpus,
    parse_gpu_fraction,
    parse_label,
    parse_memory,
)
from .stale import add_stale_arg, error_line, note_stale

EXIT_OK = 0
#: ``submit --dry-run``: the submission would be refused (the request itself was fine).
EXIT_WOULD_REFUSE = 1
#: ``--wait`` on a job that ended without an exit code of its own (docker run's "not the program's" 125).
EXIT_JOB_ENDED_WITHOUT_CODE = 125
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

ACTIVE_STATES = "pending,bound,running,suspended"
TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "rejected"})

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")


# --- argument types -------------------------------------------------------------------------------


def parse_duration(text: str) -> int:
    """Seconds from ``3600``, ``90m``, ``2h30m``, ``1d`` or Slurm's ``[D-]HH:MM:SS`` / ``MM:SS``."""
    text = text.strip().lower()
    if ":" in text:
        days = 0
        if "-" in text:
            day_part, text = text.split("-", 1)
            days = int(day_part)
        parts = [int(p) for p in text.split(":")]
        if len(parts) > 3:
            raise argparse.ArgumentTypeError(f"not a duration: {text!r}")
        seconds = 0
        for part in parts:
            seconds = seconds * 60 + part
        return days * 86400 + seconds
    match = _DURATION.match(text)
    if not text or match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 3600, 90m, 2h30m or 1-00:00:00)")
    d, h, m, s = (int(g) if g else 0 for g in match.groups())
    return d * 86400 + h * 3600 + m * 60 + s


def parse_env(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--env wants NAME=VALUE, got {text!r}")
    return name, value


def parse_secret(text: str) -> tuple[str, str]:
    """``NAME=@FILE`` (or ``NAME=@-``: standard input) -> (NAME, the file's content less one trailing
    newline). Never a value on the command line, where ``ps`` and the shell's history would keep it."""
    name, sep, source = text.partition("=")
    if not sep or not name or not source.startswith("@") or len(source) < 2:
        raise argparse.ArgumentTypeError(
            f"--secret wants NAME=@FILE or NAME=@- (standard input), got one for {name or '?'!r}: a "
            "value on the command line would stay in the shell's history and in ps"
        )
    path = source[1:]
    try:
        if path == "-":
            content = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as file:
                content = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        # the reason only (no such file, not UTF-8): never a byte of what was read
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise argparse.ArgumentTypeError(f"--secret {name}: cannot read {path}: {reason}") from None
    # one trailing newline, as an editor or `echo` leaves it (a Windows one too)
    return name, content[:-2] if content.endswith("\r\n") else content.removesuffix("\n")


# --- parsers --------------------------------------------------------------------------------------


def _api_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-url",
        default=None,
        help="API base URL (default: $RALLY_API_URL, then ./.rally/cluster.json, then http://127.0.0.1:8080)",
    )


#: `rally submit`'s dependency flags (the API's depends_on kinds) and when each is met.
DEPENDENCY_FLAGS: dict[str, str] = {
    "after": "have been placed (given their GPUs)",
    "after-ok": "have completed",
    "after-not-ok": "have failed or been cancelled",
    "after-any": "have ended",
}


_AFFINITY_FLAGS = (
    (
        "--affinity",
        parse_affinity,
        "run on a node (or rack) that holds a running job of your team in GROUP (anywhere while none runs); "
        "repeatable",
    ),
    (
        "--anti-affinity",
        parse_anti_affinity,
        "never on a node (or rack) that holds a running job of your team in GROUP, e.g. web:rack for "
        "replicas in different racks; repeatable",
    ),
)


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    submit = subparsers.add_parser(
        "submit",
        help="submit a gang job",
        description="Submit a job: `rally submit --gpus 16 --team nlp -- python train.py --lr 3e-4`. "
        "Prints the job id.",
    )
    submit.add_argument(
        "--gpus", type=int, help="GPUs of the whole gang (all or nothing); 1 with --gpu-fraction"
    )
    submit.add_argument(
        "--gpu-fraction",
        type=parse_gpu_fraction,
        dest="gpu_milli",
        metavar="F",
        help="a share of one GPU (0.25 or 25%%), shared with other such jobs; one rank",
    )
    submit.add_argument(
        "--gpu-memory",
        type=parse_memory,
        dest="gpu_memory_mib",
        metavar="SIZE",
        help="GPU memory a share needs (20G): its share of a GPU is at least this part of the GPU's memory; "
        "alone it asks for a share too",
    )
    submit.add_argument(
        "--node-selector",
        type=parse_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run only on nodes with this label (repeatable: all of them), e.g. zone=a",
    )
    submit.add_argument(
        "--toleration",
        action="append",
        default=[],
        dest="tolerations",
        metavar="KEY[=VALUE]",
        help="may run on nodes with this taint (repeatable; a bare KEY tolerates any value), "
        "e.g. dedicated=inference",
    )
    for flag, parse, help_text in _AFFINITY_FLAGS:
        submit.add_argument(
            flag, type=parse, action="append", default=[], dest="affinity", metavar="GROUP[:node|rack]",
            help=help_text,
        )  # fmt: skip
    submit.add_argument(
        "--kind",
        choices=("batch", "service"),
        help="service: runs until cancelled, restarted whenever its ranks exit, never preempted "
        "(default batch: runs to completion)",
    )
    submit.add_argument(
        "--mig",
        dest="mig_profile",
        metavar="PROFILE",
        help="a MIG slice of this profile (1g.10gb, 3g.40gb, ...) on a GPU in MIG mode; one rank",
    )
    submit.add_argument(
        "--cpus", type=parse_cpus, dest="cpu_milli", metavar="N", help="CPU cores per task (4, 0.5, 500m)"
    )
    submit.add_argument(
        "--memory",
        type=parse_memory,
        dest="memory_mib",
        metavar="SIZE",
        help="host memory per task (32G, 512M)",
    )
    submit.add_argument(
        "--min-gpus", type=int, help="elastic: the fewest GPUs it may run on (shrunk to free GPUs for others)"
    )
    submit.add_argument("--max-gpus", type=int, help="elastic: the most GPUs it may grow to when idle")
    submit.add_argument("--gpu-step", type=int, help="elastic: sizes go in steps of this many GPUs")
    submit.add_argument(
        "--gpus-per-node",
        type=int,
        dest="gpus_per_task",
        metavar="N",
        help="GPUs per task; a task runs on one node, and a node with room may run several tasks of the "
        "gang (default: min(gpus, node size); for an elastic job the largest that divides every size)",
    )
    submit.add_argument(
        "--ranks-per-node",
        type=int,
        dest="ranks_per_task",
        metavar="N",
        help="processes per task (default: one per GPU)",
    )
    submit.add_argument(
        "--team",
        default=os.environ.get("RALLY_TEAM"),
        help="team (default $RALLY_TEAM, else the token's team)",
    )
    # No choices: a cluster's queue file may define its own classes, which only the API knows.
    submit.add_argument(
        "--priority",
        help="priority class, one the cluster's queue file defines "
        f"(built-in: {', '.join(PRIORITY_CLASSES)}); default: the cluster's default class",
    )
    submit.add_argument("--name", help="job name (default: derived from the command)")
    submit.add_argument(
        "--time-limit", type=parse_duration, help="wall-clock limit: 3600, 90m, 2h, 1-00:00:00"
    )
    submit.add_argument(
        "--env",
        type=parse_env,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for every rank (repeatable); visible to the team and admins",
    )
    submit.add_argument(
        "--secret",
        type=parse_secret,
        action="append",
        default=[],
        metavar="NAME=@FILE",
        help="secret environment variable for every rank, read from FILE (@- for stdin; one trailing "
        "newline dropped); never stored in the log nor shown by the API (repeatable)",
    )
    submit.add_argument("--gpu-type", help="only nodes with this GPU type")
    submit.add_argument(
        "--gpu-types", help="comma list of acceptable GPU types, most preferred first (not with --gpu-type)"
    )
    submit.add_argument(
        "--topology",
        choices=TOPOLOGY_LEVELS,
        dest="topology_required",
        help="every GPU of the gang within one such domain",
    )
    submit.add_argument(
        "--prefer-topology",
        choices=TOPOLOGY_LEVELS,
        dest="topology_preferred",
        help="pack within one such domain when possible",
    )
    submit.add_argument(
        "--checkpoint-dir",
        help="where the job writes sharded checkpoints: an absolute path in ROOT/<team>/, ROOT the "
        "cluster's checkpoint root (default ROOT/<job id>)",
    )
    submit.add_argument("--max-retries", type=int, help="restarts after a failure (0-100)")
    for kind, when in DEPENDENCY_FLAGS.items():
        submit.add_argument(
            f"--{kind}",
            action="append",
            default=[],
            metavar="JOB[,JOB...]",
            help=f"wait until these jobs of the team {when} (repeatable)",
        )
    submit.add_argument(
        "--array",
        metavar="INDICES[%N]",
        help="one job per index (0-99, 1,3,5-7, 0-30:10), each with $RALLY_ARRAY_INDEX; %%N: at most N of "
        "them hold GPUs at once. Prints the array id; `rally cancel ID` cancels every member",
    )
    submit.add_argument(
        "--singleton",
        action="store_true",
        help="wait until every earlier job of the team with this name has ended",
    )
    submit.add_argument("--idempotency-key", help="retrying with the same key never creates a second job")
    submit.add_argument(
        "--wait",
        action="store_true",
        help="follow the job until it ends; exit with its exit code (0 if it completed), "
        "125 if it ended without one (cancelled, rejected, failed by the cluster)",
    )
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="submit nothing: print whether it would be admitted, its queue and quota, where it would "
        "run now or why it would wait (exit 1 if it would be refused)",
    )
    submit.add_argument("--poll-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    add_output_args(submit)
    _api_arg(submit)
    submit.add_argument("command", nargs=argparse.REMAINDER, help="-- the program and its arguments")
    submit.set_defaults(func=cmd_submit)

    jobs = subparsers.add_parser(
        "jobs",
        help="list jobs (like squeue)",
        description="List jobs. By default only pending and running ones.",
    )
    jobs.add_argument("--all", "-a", action="store_true", help="include finished jobs")
    jobs.add_argument("--state", "-t", help="comma-separated states (pending,bound,running,completed,...)")
    jobs.add_argument("--team", help="only this team's jobs")
    jobs.add_argument("--limit", type=int, help="at most this many jobs")
    add_output_args(jobs)
    add_stale_arg(jobs)
    _api_arg(jobs)
    jobs.set_defaults(func=cmd_jobs)

    nodes = subparsers.add_parser("nodes", help="list nodes (like sinfo -N)")
    add_output_args(nodes)
    add_stale_arg(nodes)
    _api_arg(nodes)
    nodes.set_defaults(func=cmd_nodes)
    add_node_action_parsers(nodes, _api_arg)  # rally nodes drain|undrain NODE --reason TEXT

    for action, what in (
        (
            "suspend",
            "checkpoint and stop a job, freeing its GPUs until `rally resume` (like scontrol suspend)",
        ),
        ("resume", "put a suspended job back in its place in the queue (like scontrol resume)"),
    ):
        sub = subparsers.add_parser(action, help=what)
        sub.add_argument("job_id")
        add_output_args(sub)
        _api_arg(sub)
        sub.set_defaults(func=cmd_suspend_or_resume, action=action)
    cancel = subparsers.add_parser("cancel", help="cancel a job (like scancel)")
    cancel.add_argument("job_id")
    add_output_args(cancel)
    _api_arg(cancel)
    cancel.set_defaults(func=cmd_cancel)


# --- submit ---------------------------------------------------------------------------------------


def default_name(command: Sequence[str]) -> str:
    """A valid job name from the program: ``python train.py`` -> ``train``, ``/bin/Sleep`` -> ``sleep``."""
    words = [w for w in command if not w.startswith("-")]
    interpreters = {"python", "python3", "torchrun", "bash", "sh", "env", "uv", "srun"}
    # A script file names the job better than its launcher, or a flag's value (`--nproc-per-node 8`).
    scripts = [w for w in words if w.endswith((".py", ".sh"))]
    programs = [w for w in words if os.path.basename(w) not in interpreters]
    pick = (scripts or programs or words or ["job"])[0]
    stem = os.path.basename(pick).rsplit(".", 1)[0].lower()
    name = re.sub(r"[^a-z0-9._-]+", "-", stem).strip("._-")[:63].strip("._-")
    return name or "job"


def build_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The request body from the flags: only what was given, so the API applies the cluster's defaults."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    one_share = args.gpu_milli is not None or args.gpu_memory_mib is not None or args.mig_profile is not None
    gpus = args.gpus if args.gpus is not None or not one_share else 1
    body: dict[str, Any] = {"name": args.name or default_name(command), "gpus": gpus, "command": command}
    if args.team:
        # Without one the API takes the token's team (an admin token must name one).
        body["team"] = args.team
    optional = {
        "gpus_per_task": args.gpus_per_task,
        "ranks_per_task": args.ranks_per_task,
        "priority": args.priority,
        "time_limit_s": args.time_limit,
        "gpu_type": args.gpu_type,
        "gpu_types": args.gpu_types.split(",") if args.gpu_types else None,
        "topology_required": args.topology_required,
        "topology_preferred": args.topology_preferred,
        "checkpoint_dir": args.checkpoint_dir,
        "max_retries": args.max_retries,
        "min_gpus": args.min_gpus,
        "max_gpus": args.max_gpus,
        "gpu_step": args.gpu_step,
        "gpu_milli": args.gpu_milli,
        "gpu_memory_mib": args.gpu_memory_mib,
        "mig_profile": args.mig_profile,
        "kind": args.kind,
        "node_selector": dict(args.node_selector) or None,
        "tolerations": list(args.tolerations) or None,
        "affinity": list(args.affinity) or None,
        "cpu_milli": args.cpu_milli,
        "memory_mib": args.memory_mib,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if args.env:
        body["env"] = dict(args.env)
    if args.secret:
        body["secrets"] = dict(args.secret)
    depends_on = [
        {"kind": kind, "job_id": job_id.strip()}
        for kind in DEPENDENCY_FLAGS
        for value in getattr(args, kind.replace("-", "_"))
        for job_id in value.split(",")
    ]
    if depends_on:
        body["depends_on"] = depends_on
    if args.singleton:
        body["singleton"] = True
    if args.array:
        body["array"] = args.array
    return body


#: The `rally submit` flag that sets each field of the API's job spec: a refusal, the API's or the local
#: check's, names what the user typed (`--gpus-per-node`), not the field it became (`gpus_per_task`).
SUBMIT_FLAGS: dict[str, str] = {
    "gpus": "--gpus",
    "gpus_per_task": "--gpus-per-node",
    "ranks_per_task": "--ranks-per-node",
    "min_gpus": "--min-gpus",
    "max_gpus": "--max-gpus",
    "gpu_step": "--gpu-step",
    "team": "--team",
    "priority": "--priority",
    "name": "--name",
    "time_limit_s": "--time-limit",
    "env": "--env",
    "secrets": "--secret",
    "gpu_type": "--gpu-type",
    "gpu_types": "--gpu-types",
    "topology_required": "--topology",
    "topology_preferred": "--prefer-topology",
    "checkpoint_dir": "--checkpoint-dir",
    "max_retries": "--max-retries",
    "singleton": "--singleton",
    "array": "--array",
    "gpu_milli": "--gpu-fraction",
    "gpu_memory_mib": "--gpu-memory",
    "mig_profile": "--mig",
    "kind": "--kind",
    "node_selector": "--node-selector",
    "tolerations": "--toleration",
    "affinity": "--affinity",
    "cpu_milli": "--cpus",
    "memory_mib": "--memory",
}
# A field named inside a message: one with an underscore wherever it stands as a word; a plain word
# (gpus, name) only where it is followed by its value (``gpus=8``), so prose is left alone.
_FIELD_IN_TEXT = re.compile(
    r"(?<![\w.-])("
    + "|".join(sorted((f for f in SUBMIT_FLAGS if "_" in f), key=len, reverse=True))
    + r")(?![\w])|(?<![\w.-])("
    + "|".join(f for f in SUBMIT_FLAGS if "_" not in f)
    + r")(?==)"
)


def flag_error(field: str | None, detail: str) -> str:
    """``error: <flag>: <detail>`` with every spec field in it named by its `rally submit` flag."""
    text = _FIELD_IN_TEXT.sub(lambda m: SUBMIT_FLAGS[m.group(1) or m.group(2)], detail)
    if field is None:
        return f"error: {text}"
    head, dot, rest = field.partition(".")
    flag = SUBMIT_FLAGS.get(head)
    where = field if flag is None else f"{flag} {rest}" if dot else flag
    return f"error: {where}: {text}"


def _precheck(body: dict[str, Any]) -> str | None:
    """Catch what needs no cluster knowledge before a round trip; sizes are the API's to judge."""
    if not body["command"]:
        return "error: command: is required, after `--` (rally submit --gpus 8 -- python train.py)"
    if body["gpus"] is None:
        return "error: --gpus: is required (or --gpu-fraction / --mig for a share of one GPU)"
    try:
        # Any node size passes here: the API knows the real one and fills gpus_per_task from it.
        # A stand-in team when none is given: the API fills in the token's. The priority is left out:
        # which classes exist is the cluster's queue file's to say, and the API names them on refusal.
        validate_spec(
            {"team": "x", **body, "priority": None},
            max_gpus_per_node=max(int(body["gpus"]), 1),
        )
    except SpecError as err:
        if err.field not in {"gpus_per_task", "ranks_per_task", "min_gpus", "max_gpus", "gpu_step"}:
            return flag_error(err.field, err.detail)
    try:
        if "array" in body:
            parse_array(body["array"])
    except SpecError as err:
        return flag_error(err.field, err.detail)
    return None


def cmd_submit(args: argparse.Namespace) -> int:
    body = build_spec(args)
    problem = _precheck(body)
    if problem:
        print(problem, file=sys.stderr)
        return EXIT_ERROR
    client = ApiClient(resolve_api_url(args.api_url))
    if args.dry_run:
        return dry_run(client, body, args)
    resp = _answer(lambda: client.submit(body, idempotency_key=args.idempotency_key))
    if resp is None:
        return EXIT_ERROR
    job_id = str(resp.body["job_id"])
    replayed = resp.headers.get("idempotent-replayed") == "true"
    if "array_id" in resp.body:
        return _submitted_array(resp.body, replayed, as_json=wants_json(args), wait=args.wait)
    # -o json: JSON Lines, this object first, then with --wait the job's view at each change
    print(json.dumps({"job_id": job_id, "replayed": replayed}) if wants_json(args) else job_id, flush=True)
    if replayed:
        print(
            f"note: {job_id} was already submitted with this idempotency key; not submitted again",
            file=sys.stderr,
        )
    if not args.wait:
        return EXIT_OK
    return wait_for_job(client, job_id, poll_interval=args.poll_interval, as_json=wants_json(args))


def _submitted_array(body: dict[str, Any], replayed: bool, *, as_json: bool, wait: bool) -> int:
    """Print an array's id (its members are ``ID_<index>``: ``rally jobs``, ``rally cancel ID``)."""
    array_id, job_ids = str(body["array_id"]), [str(j) for j in body["job_ids"]]
    if as_json:
        print(json.dumps({"array_id": array_id, "job_ids": job_ids, "replayed": replayed}), flush=True)
    else:
        print(array_id, flush=True)
        print(f"note: array of {len(job_ids)} jobs, {job_ids[0]} .. {job_ids[-1]}", file=sys.stderr)
    if wait:
        print("note: --wait follows single jobs; follow an array with `rally jobs`", file=sys.stderr)
    return EXIT_OK


def _answer(call: Callable[[], Response]) -> Response | None:
    """The API's answer to a submission, or None once why there is none is printed: its refusal, with
    the flags the user typed, or the API out of reach."""
    try:
        return call()
    except ApiError as err:
        print(flag_error(err.field, err.detail), file=sys.stderr)
    except ApiUnreachable as err:
        print(err.line(), file=sys.stderr)
    return None


def dry_run(client: ApiClient, body: dict[str, Any], args: argparse.Namespace) -> int:
    """``submit --dry-run``: the API's answer (``POST /v1/jobs?dry_run=true``), printed; exit 0 when it
    would be admitted (placed or waiting), ``EXIT_WOULD_REFUSE`` when not."""
    if args.wait:
        print("error: --wait: cannot follow a dry run (it submits nothing)", file=sys.stderr)
        return EXIT_ERROR
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    params = {"dry_run": "true"}
    resp = _answer(lambda: client.request("POST", "/v1/jobs", body=body, headers=headers, params=params))
    if resp is None:
        return EXIT_ERROR
    answer: dict[str, Any] = resp.body
    print(json.dumps(answer) if wants_json(args) else format_dry_run(answer))
    return EXIT_OK if answer["would_admit"] else EXIT_WOULD_REFUSE


def format_dry_run(answer: dict[str, Any]) -> str:
    """The dry run's answer as a person reads it: the verdict, then one line each for the placement or
    the reason, what would let it start, the quota and the log position it was judged at."""
    reason = answer.get("reason")
    if not answer["would_admit"]:
        lines = [f"Would be refused: {_reason_text(reason or {})}"]
    else:
        lines = [f"Would be admitted to queue {answer['queue']}"]
        if (placement := answer.get("placement")) is not None:
            lines.append(f"Placement: {_placement_text(placement)}")
        elif reason is not None:
            lines.append(f"Would wait: {_reason_text(reason)}")
    explanation = answer.get("explanation") or {}
    if answer["would_admit"] and answer.get("placement") is None:
        lines.extend(f"To start: {line}" for line in explanation.get("would_start", ()))
    if (quota := answer.get("quota")) is not None:
        lines.append(f"Quota: {_quota_text(quota)}")
    if (start := answer.get("predicted_start")) is not None:
        lines.append(f"Predicted start: {start_text(start, now=time.time(), long=True)}")
    if answer.get("job_id"):
        lines.append(f"Job id: {answer['job_id']} (its Idempotency-Key's)")
    lines.append(f"Log position: {answer['log_position']} (nothing was submitted)")
    return "\n".join(lines)


def _reason_text(reason: dict[str, Any]) -> str:
    ahead = reason.get("jobs_ahead")
    where = f", #{ahead + 1}" if isinstance(ahead, int) else ""
    named = reason.get("limit") or (SUBMIT_FLAGS.get(reason["field"]) if reason.get("field") else None)
    also = f" ({named})" if named else ""
    return f"{reason.get('code', '?')}{where}{also}: {reason.get('message', '')}"


def _placement_text(placement: dict[str, Any]) -> str:
    tasks = "; ".join(
        f"task {t['task']} on {t['node_id']} GPUs {','.join(str(g) for g in t['gpus'])}"
        for t in placement["tasks"]
    )
    return f"{placement['gpus']} {placement['gpu_type']} GPUs on {hostlist(placement['nodes'])} ({tasks})"


def _quota_text(quota: dict[str, Any]) -> str:
    return (
        f"queue {quota['queue']} uses {quota['used']:g} of nominal {quota['nominal']:g} {quota['gpu_type']} "
        f"GPUs; room for {quota['room']:g} more"
    )


def describe(job: dict[str, Any]) -> str:
    """One line for a state change: ``running on n0,n1`` / ``pending (Resources: needs 16 GPUs...)``."""
    state = str(job["state"])
    reason = job.get("pending_reason")
    if state == "pending" and reason:
        return f"pending ({reason['code']}: {reason['message']})"
    if state in {"bound", "running"}:
        return f"{state} on {hostlist(job.get('nodes') or [])} (attempt {job.get('attempt', 0)})"
    if state == "failed":
        code = job.get("exit_code")
        suffix = f" (exit code {code})" if code is not None else ""
        return f"failed: {job.get('reason') or 'unknown reason'}{suffix}"
    if state in {"rejected", "cancelled"} and job.get("reason"):
        return f"{state}: {job['reason']}"
    return state


def exit_status(job: dict[str, Any]) -> int:
    """What ``--wait`` exits with for a finished job: 0 if it completed, the job's exit code if it failed
    with one a shell can pass on (1-255), else ``EXIT_JOB_ENDED_WITHOUT_CODE``."""
    if job["state"] == "completed":
        return EXIT_OK
    code = job.get("exit_code")
    if isinstance(code, int) and 0 < code < 256:
        return code
    return EXIT_JOB_ENDED_WITHOUT_CODE


def wait_for_job(
    client: ApiClient,
    job_id: str,
    *,
    poll_interval: float = 1.0,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
    unreachable_grace_s: float = 60.0,
    as_json: bool = False,
) -> int:
    """Poll the job, print each change (``as_json``: the job's view, one JSON object a line), return its
    exit status (``exit_status``). The API may restart meanwhile (a rolling upgrade): keep trying for
    ``unreachable_grace_s``.
    """
    stream = out or sys.stdout
    last: str | None = None
    unreachable_since: float | None = None
    try:
        while True:
            try:
                job = client.get_job(job_id)
                unreachable_since = None
            except ApiUnreachable as err:
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > unreachable_grace_s:
                    print(err.line(), file=sys.stderr)
                    return EXIT_ERROR
                sleep(poll_interval)
                continue
            except ApiError as err:
                print(err.line(), file=sys.stderr)
                return EXIT_ERROR
            line = describe(job)
            if line != last:
                shown = json.dumps(job) if as_json else f"{time.strftime('%H:%M:%S')} {job_id} {line}"
                print(shown, file=stream, flush=True)
                last = line
            if job["state"] in TERMINAL_STATES:
                return exit_status(job)
            sleep(poll_interval)
    except KeyboardInterrupt:
        print(
            f"\nstopped waiting; {job_id} keeps going (cancel it with `rally cancel {job_id}`)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


# --- jobs, nodes, cancel --------------------------------------------------------------------------


def format_elapsed(seconds: float) -> str:
    """squeue's TIME: ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def hostlist(nodes: Sequence[str]) -> str:
    """Slurm-style compression: ``n0,n1,n2,n5,gpu-a`` -> ``gpu-a,n[0-2,5]``."""
    groups: dict[str, list[tuple[int, str]]] = {}
    plain: list[str] = []
    for node in sorted(set(nodes)):
        match = re.match(r"^(.*?)(\d+)$", node)
        if match is None:
            plain.append(node)
        else:
            groups.setdefault(match.group(1), []).append((int(match.group(2)), match.group(2)))
    parts = list(plain)
    for prefix, numbered in sorted(groups.items()):
        numbered.sort()
        if len(numbered) == 1:
            parts.append(prefix + numbered[0][1])
            continue
        ranges: list[str] = []
        start = prev = numbered[0]
        for item in [*numbered[1:], (-2, "")]:
            # Zero-padded numbers only merge with the same width, so n01 and n1 never become n[01-1].
            if item[0] == prev[0] + 1 and len(item[1]) == len(prev[1]):
                prev = item
                continue
            ranges.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
            start = prev = item
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(sorted(parts))


def nodes_or_reason(job: dict[str, Any]) -> str:
    state = job["state"]
    if state == "pending":
        return f"({pending_text(job)})"
    if state in {"failed", "rejected"}:
        return f"({job.get('reason') or state})"
    nodes = hostlist(job.get("nodes") or [])
    if nodes:
        return nodes
    # a job cancelled before it was placed never had nodes: say why it holds none
    return f"({job.get('reason') or state.capitalize()})"


def pending_text(job: dict[str, Any]) -> str:
    """squeue's reason code, where the job stands in the scheduler's order (1 = next) and the reason's
    numbers: ``Resources, #2: needs 16 GPUs in the cluster; 8 free; 1 job ahead``. The place and the
    message come from the same reason, so "#2" always sits beside "1 job ahead"."""
    reason = job.get("pending_reason") or {}
    code = reason.get("code") or "AwaitingScheduler"
    position = job.get("queue_position")
    where = f", #{position}" if position is not None else ""
    message = reason.get("message")
    return f"{code}{where}: {message}" if message else f"{code}{where}"


def job_elapsed(job: dict[str, Any], now: float) -> float:
    start = job.get("started_at")
    if start is None:
        start = job.get("bound_at")
    if start is None:
        return 0.0
    end = job.get("ended_at")
    if end is None:
        end = now
    return float(end) - float(start)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart; the last column is not padded (no trailing blanks)."""
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def gpus_held(job: dict[str, Any]) -> str:
    """The GPUS column: what the job holds now (an elastic gang grown to 16 shows 16, not the 8 it asked),
    what it asks while it holds none; an elastic job's range after it: ``16 (8-16)``."""
    held = sum(len(task["gpus"]) for task in job.get("allocation") or [])
    shown = held or job["gpus"]
    spec = job.get("spec") or {}
    low, high = spec.get("min_gpus"), spec.get("max_gpus")
    if low is None and high is None:
        return str(shown)
    return f"{shown} ({low if low is not None else job['gpus']}-{high if high is not None else job['gpus']})"


def format_jobs(jobs: Sequence[dict[str, Any]], *, now: float) -> str:
    headers = ("ID", "TEAM", "NAME", "STATE", "TIME", "GPUS", "START", "NODES(REASON)")
    rows = [
        (
            j["job_id"],
            j["team"],
            j["name"],
            str(j["state"]).upper(),
            format_elapsed(job_elapsed(j, now)),
            gpus_held(j),
            start_text(j.get("predicted_start"), now=now),
            nodes_or_reason(j),
        )
        for j in jobs
    ]
    return format_table(headers, rows)


def span(seconds: float) -> str:
    """A duration as people say it: ``45s``, ``12m``, ``3h05m``, ``2d04h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def start_text(predicted: dict[str, Any] | None, *, now: float, long: bool = False) -> str:
    """The START column (``long``: `rally show`'s line): a waiting job's predicted start from now, P50 then
    P90 (``in 12m (p90 40m)``); ``-`` for a job that does not wait."""
    if not predicted:
        return "-"
    status = predicted.get("status")
    if status == "now":
        return "now"
    if status in ("predicted", "estimated"):
        p50, p90 = float(predicted["p50"]), predicted.get("p90")
        text = "now" if p50 <= now else f"in {span(p50 - now)}"
        if status == "estimated":  # fitted into the last forecast, not run forward: roughly
            text = "~" + text
        if p90 is not None and float(p90) > p50:
            text += f" (p90 {'now' if float(p90) <= now else span(float(p90) - now)})"
        if long:
            text += f"; own runtime ~{span(float(predicted['runtime_p50_s']))}"
            text += f" from {predicted.get('runtime_from')} history"
            if predicted.get("computed_at_seq") is not None:
                text += f", as of log seq {predicted['computed_at_seq']}"
            if status == "estimated":
                text += f"; estimated from the forecast of log seq {predicted.get('forecast_seq')}"
        return text
    if status == "beyond-horizon":
        return f"beyond {span(float(predicted.get('horizon_s') or 0))}"
    if status == "pending-refresh":
        return "soon known"
    return "unknown" + (f" ({predicted.get('detail')})" if long and predicted.get("detail") else "")


def node_health(node: dict[str, Any]) -> str:
    """``degraded: job j1 rank 2 straggler 3.1 >= 1.43``: the verdict and its first finding; ``-`` for a
    node that sends no signals (lost, unreachable), whose last verdict says nothing about it now."""
    if node.get("status") in SILENT_STATUSES:
        return "-"
    health = str(node.get("health") or "healthy")
    evidence = node.get("health_evidence") or []
    if not evidence:
        return health
    first = evidence[0]
    more = f" (+{len(evidence) - 1})" if len(evidence) > 1 else ""
    finding = f"{first['subject']} {first['signal']} {first['value']:g} >= {first['threshold']:g}"
    return f"{health}: {finding}{more}"


#: A node the health monitor hears nothing from: its status is all there is to say.
SILENT_STATUSES = frozenset({"lost", "unreachable"})


def node_state(node: dict[str, Any]) -> str:
    """sinfo's STATE, shown as STATUS: ``lost`` / ``unreachable``; for a node out of service (drained,
    or cordoned by its health) ``draining`` while jobs still run on it, else ``drained`` or its verdict
    (``degraded``); ``up`` otherwise."""
    status = str(node.get("status") or "?")
    health = str(node.get("health") or "healthy")
    if status in SILENT_STATUSES or (status == "up" and health not in CORDONING_HEALTH):
        return status
    if node.get("draining_jobs") or (node.get("gpus") or {}).get("allocated"):
        return "draining"
    return "drained" if status == "drained" else health


#: The verdicts that take a node out of service (``NodeView.cordoned``).
CORDONING_HEALTH = frozenset({"degraded", "failed"})


def node_jobs(node: dict[str, Any]) -> str:
    """The node's jobs; on a draining node each with its plan: ``j-1 after-checkpoint by 10:32:05``."""
    plans = {p["job_id"]: p for p in node.get("draining_jobs") or []}
    cells = []
    for job_id in node.get("jobs") or []:
        plan = plans.get(job_id)
        if plan is None:
            cells.append(job_id)
            continue
        deadline = plan.get("deadline")
        by = f" by {time.strftime('%H:%M:%S', time.localtime(deadline))}" if deadline is not None else ""
        cells.append(f"{job_id} {plan['plan']}{by}")
    return ",".join(cells) or "-"


def shared_text(shared: dict[str, int], mig: dict[str, list[dict[str, Any]]] | None = None) -> str:
    """The GPUs fractional jobs share, each with the part of it they hold (``gpu0=0.9``), and the GPUs in
    MIG mode with their busy slices (``gpu1=mig:3g.40gb@0+1g.10gb@6``; ``gpu2=mig:-`` when none)."""
    parts = {int(g): f"gpu{g}={milli / 1000:g}" for g, milli in shared.items()}
    for g, cuts in (mig or {}).items():
        held = "+".join(f"{c['profile']}@{c['start']}" for c in cuts) or "-"
        parts[int(g)] = f"gpu{g}=mig:{held}"
    return ",".join(parts[g] for g in sorted(parts)) or "-"


def format_nodes(nodes: Sequence[dict[str, Any]]) -> str:
    headers = ("NODE", "RACK", "STATUS", "HEALTH", "GPU_TYPE", "GPUS(FREE/TOTAL)", "SHARED", "JOBS")
    rows = [
        (
            n["node_id"],
            n["rack"],
            node_state(n).upper(),
            node_health(n),
            n["gpu_type"],
            f"{n['gpus']['free']}/{n['gpus']['total']}",
            shared_text(n.get("shared_gpus") or {}, n.get("mig_gpus") or {}),
            node_jobs(n),
        )
        for n in nodes
    ]
    return format_table(headers, rows)


def cmd_jobs(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    state = args.state or (None if args.all else ACTIVE_STATES)
    try:
        listing = client.list_jobs(state=state, team=args.team, limit=args.limit, stale=args.stale)
    except (ApiError, ApiUnreachable) as err:
        print(error_line(err, args), file=sys.stderr)
        return EXIT_ERROR
    note_stale(args, listing)
    if wants_json(args):  # the API's JobList, so scripts parse one shape whichever way they ask
        print(json.dumps(listing, indent=2))
    else:
        print(format_jobs(listing["jobs"], now=time.time()))
    return EXIT_OK


def cmd_nodes(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    try:
        listing = client.list_nodes(stale=args.stale)
    except (ApiError, ApiUnreachable) as err:
        print(error_line(err, args), file=sys.stderr)
        return EXIT_ERROR
    note_stale(args, listing)
    print(json.dumps(listing, indent=2) if wants_json(args) else format_nodes(listing["nodes"]))
    return EXIT_OK


def cmd_suspend_or_resume(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    try:
        answer = client.suspend_or_resume(args.job_id, args.action)
    except (ApiError, ApiUnreachable) as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    if wants_json(args):
        print(json.dumps(answer, indent=2))
    elif args.action == "suspend":
        print(f"suspend requested for {args.job_id} (now {answer['state']})")
    else:
        print(f"{args.job_id} resumed (now {answer['state']})")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    client = ApiClient(resolve_api_url(args.api_url))
    try:
        answer = client.cancel(args.job_id)
    except (ApiError, ApiUnreachable) as err:
        print(err.line(), file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(answer, indent=2) if wants_json(args) else f"cancel requested for {args.job_id}")
    return EXIT_OK
