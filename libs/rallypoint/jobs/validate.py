"""Job-spec validation shared by the API and the CLI. Pure: no I/O, no clock.

A submission arrives as a dict decoded from JSON. ``validate_spec`` turns it into a ``JobSpec`` or
raises ``SpecError`` naming the first offending field, so the API can answer a problem+json body that
points at it and the CLI can print ``error: <field>: <detail>``. Nothing invalid is ever appended to
the log: the scheduler and every fold may assume a ``JobSpec`` in a ``JobSubmitted`` is coherent.

Every number and size a submission may carry is bounded (the "Limits" section of docs/api.md): what
passes here fits a NATS message, a PostgreSQL column and an exec() of the ranks.

Job ids are derived here too, because they become NATS subject tokens (``rally.job.<id>``) and an id
derived from (team, Idempotency-Key) is what makes a retried submission land on the existing job.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
import secrets
from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any, Literal, cast, get_args

import msgspec

from rallypoint.events import Dependency, JobSpec, TopologyLevel
from rallypoint.events.catalogue import GPU_MILLI
from rallypoint.events.subjects import TOKEN_PATTERN

from .launch import CONTRACT_VARIABLES
from .placement_rules import check_affinity, check_tolerations
from .text import SpecError, check_strings, utf8_fault

DEFAULT_MAX_GPUS_PER_NODE = 8
MAX_RETRIES_LIMIT = 100
MAX_DEPENDENCIES = 64
DEPENDENCY_KINDS: tuple[str, ...] = ("after", "after-ok", "after-not-ok", "after-any")
MAX_GPU_TYPES = 16
MAX_IDEMPOTENCY_KEY_LENGTH = 255

# --- limits (docs/api.md, "Limits"; the OpenAPI schema states the same numbers) ----------------------
#: Nesting of arrays and objects in a request body: a spec needs 3; JSON decoders recurse per level.
MAX_JSON_DEPTH = 32
#: Any GPU count (gpus, gpus_per_task, min_gpus, ...): ten times the largest cluster we plan for.
MAX_GPUS = 1_000_000
MAX_TIME_LIMIT_S = 365 * 24 * 3600  # one year
#: One command argument or environment value, in UTF-8 bytes. Linux refuses any single exec string over
#: 128 KiB (MAX_ARG_STRLEN) with "Argument list too long", after the job was already scheduled.
MAX_ARG_BYTES = 32 * 1024
MAX_COMMAND_ITEMS = 4096
MAX_ENV_VARS = 256
MAX_ENV_NAME_LENGTH = 256
#: The whole command, and the whole env, as JSON: together they keep a JobSubmitted well under NATS's
#: 1 MiB message limit and the ranks' exec well under Linux's 2 MiB ARG_MAX.
MAX_COMMAND_BYTES = 256 * 1024
MAX_ENV_BYTES = 256 * 1024
#: gpu_type, each of gpu_types, checkpoint_dir (PATH_MAX).
MAX_TEXT_LENGTH = 4096
#: A job's secrets: a token or a key file each, a few per job. The whole set, as JSON, rides in one KV
#: value and, with the command and env, in one launch request: both under NATS's 1 MiB message limit.
MAX_SECRETS = 32
MAX_SECRET_BYTES = 64 * 1024
MAX_SECRETS_BYTES = 256 * 1024
#: A task's CPU (millicores) and host memory (MiB): far above any one machine, low enough for any column.
MAX_CPU_MILLI = 100_000_000  # 100,000 cores
MAX_MEMORY_MIB = 1 << 30  # 1 PiB

# Upper bounds of the integer fields that have no other one (max_retries has its own range).
_MAXIMUM: dict[str, tuple[int, str]] = {
    "gpus": (MAX_GPUS, " GPUs"),
    "gpus_per_task": (MAX_GPUS, " GPUs"),
    "ranks_per_task": (MAX_GPUS, ""),
    "min_gpus": (MAX_GPUS, " GPUs"),
    "max_gpus": (MAX_GPUS, " GPUs"),
    "gpu_step": (MAX_GPUS, " GPUs"),
    "time_limit_s": (MAX_TIME_LIMIT_S, " seconds (one year)"),
    "cpu_milli": (MAX_CPU_MILLI, " millicores"),
    "memory_mib": (MAX_MEMORY_MIB, " MiB"),
}

PRIORITY_CLASSES: tuple[str, ...] = (
    "production",
    "training-high",
    "interactive",
    "training-standard",
    "development",
    "best-effort",
)
#: The class of a job that names none, unless the cluster's queue file says otherwise.
DEFAULT_PRIORITY = "training-standard"
#: The class of an interactive job that names none (when the cluster has it), and of no other kind of job.
INTERACTIVE_PRIORITY = "interactive"

# Narrowest first: a preferred level wider than the required one could never be honoured.
TOPOLOGY_LEVELS: tuple[str, ...] = get_args(TopologyLevel)

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
# Teams end up in subjects, queue names and metric labels: no dots (a dot splits a subject token).
TEAM_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

REQUIRED_FIELDS: tuple[str, ...] = ("name", "team", "gpus", "command")
#: A body names its secrets with their values (``secrets``); the spec keeps their names alone, which a
#: body may not set itself.
KNOWN_FIELDS: frozenset[str] = frozenset(JobSpec.__struct_fields__) - {"secret_names"} | {"secrets"}
#: The fields whose strings may hold a tab or a newline (``text.py``): a ``sh -c`` script is an
#: argument, a PEM certificate an environment value. Every other string of a spec is one line.
FREE_TEXT_FIELDS: frozenset[str] = frozenset({"command", "env", "secrets"})


# --- field readers: each checks one type and names the field when it is wrong --------------------


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _int(body: Mapping[str, Any], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    # JSON Schema's integer (the OpenAPI document's) includes 8.0; 8.5 is not one.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    # bool is an int subclass in Python; JSON true must not pass as 1 GPU.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"must be an integer, got {_type_name(value)}")
    maximum, unit = _MAXIMUM.get(field, (None, ""))
    if maximum is not None and value > maximum:
        raise SpecError(field, f"must be <= {maximum}{unit}, got {value}")
    return value


def _str(body: Mapping[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(field, f"must be a string, got {_type_name(value)}")
    return value


def _required(body: Mapping[str, Any], field: str) -> None:
    if body.get(field) is None:
        raise SpecError(field, "is required")


# --- the validator --------------------------------------------------------------------------------


def validate_spec(
    body: object,
    *,
    max_gpus_per_node: int = DEFAULT_MAX_GPUS_PER_NODE,
    priority_classes: Sequence[str] = PRIORITY_CLASSES,
    default_priority: str = DEFAULT_PRIORITY,
) -> JobSpec:
    """Check a decoded submission body and return the ``JobSpec`` it describes, defaults filled in.

    ``max_gpus_per_node`` bounds ``gpus_per_task`` (a task lands on one node) and sets its default.
    ``priority_classes`` are the classes this cluster accepts (its queue file's, most important first)
    and ``default_priority`` the class of a job that names none: the defaults are the built-in ones.
    Raises ``SpecError`` for the first problem found, checked in a fixed order so the same body always
    names the same field.
    """
    if not isinstance(body, Mapping):
        raise SpecError("body", f"must be a JSON object, got {_type_name(body)}")
    # Every string first, keys included: what a reader downstream cannot store never reaches the log.
    check_strings(body, free_text=FREE_TEXT_FIELDS)
    unknown = sorted(str(k) for k in body if k not in KNOWN_FIELDS)
    if unknown:
        raise SpecError(unknown[0], f"unknown field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}")
    for field in REQUIRED_FIELDS:
        _required(body, field)

    name = _check_name(body)
    team = _check_team(body)
    gpus, gpus_per_task, ranks_per_task = _check_shape(body, max_gpus_per_node)
    command = _check_command(body)
    # an interactive job's default is its own class, where the cluster has it
    interactive = body.get("kind") == "interactive" and INTERACTIVE_PRIORITY in priority_classes
    priority = _check_priority(
        body, priority_classes, INTERACTIVE_PRIORITY if interactive else default_priority
    )
    env = _check_env(body)
    secret_names = tuple(sorted(check_secrets(body, env)))
    time_limit_s = _int(body, "time_limit_s")
    if time_limit_s is not None and time_limit_s <= 0:
        raise SpecError("time_limit_s", f"must be > 0 seconds, got {time_limit_s}")
    gpu_type = _non_empty_optional(body, "gpu_type")
    gpu_types = _check_gpu_types(body, gpu_type)
    checkpoint_dir = _check_checkpoint_dir_shape(body)
    topology_required, topology_preferred = _check_topology(body)
    min_gpus, max_gpus, gpu_step = _check_elastic(body, gpus, gpus_per_task)
    depends_on = _check_depends_on(body)
    singleton = _bool(body, "singleton")
    cpu_milli, memory_mib = _check_task_resources(body)
    gpu_milli = _check_gpu_milli(body, gpus, ranks_per_task, min_gpus, max_gpus)
    gpu_memory_mib = _check_gpu_memory(body, gpus, ranks_per_task, min_gpus, max_gpus)
    mig_profile = _check_mig_profile(body, gpus, ranks_per_task, min_gpus, max_gpus, gpu_milli)
    kind = _check_kind(body, time_limit_s)
    node_selector = _check_node_selector(body)
    tolerations = check_tolerations(body)
    affinity = check_affinity(body)
    max_retries = _int(body, "max_retries")
    if max_retries is None:
        max_retries = 0
    if not 0 <= max_retries <= MAX_RETRIES_LIMIT:
        raise SpecError("max_retries", f"must be between 0 and {MAX_RETRIES_LIMIT}, got {max_retries}")
    _check_interactive(kind, priority, max_retries, min_gpus is not None or max_gpus is not None)
    ports = _check_ports(body)

    return JobSpec(
        name=name,
        team=team,
        gpus=gpus,
        gpus_per_task=gpus_per_task,
        ranks_per_task=ranks_per_task,
        command=command,
        priority=priority,
        env=env,
        time_limit_s=time_limit_s,
        gpu_type=gpu_type,
        gpu_types=gpu_types,
        topology_required=topology_required,
        topology_preferred=topology_preferred,
        min_gpus=min_gpus,
        max_gpus=max_gpus,
        gpu_step=gpu_step,
        checkpoint_dir=checkpoint_dir,
        max_retries=max_retries,
        secret_names=secret_names,
        depends_on=depends_on,
        singleton=singleton,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpu_milli=gpu_milli,
        gpu_memory_mib=gpu_memory_mib,
        mig_profile=mig_profile,
        kind=kind,
        node_selector=node_selector,
        tolerations=tolerations,
        affinity=affinity,
        ports=ports,
    )


def _check_name(body: Mapping[str, Any]) -> str:
    name = _str(body, "name")
    assert name is not None
    if not NAME_PATTERN.fullmatch(name):
        raise SpecError(
            "name",
            f"{name!r} is not a valid job name: 1-63 characters, lowercase letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit",
        )
    return name


def _check_team(body: Mapping[str, Any]) -> str:
    team = _str(body, "team")
    assert team is not None
    if not TEAM_PATTERN.fullmatch(team):
        raise SpecError(
            "team",
            f"{team!r} is not a valid team: 1-63 characters, lowercase letters, digits, '_' or '-', "
            "starting and ending with a letter or digit",
        )
    return team


def _check_shape(body: Mapping[str, Any], max_gpus_per_node: int) -> tuple[int, int, int]:
    """gpus, gpus_per_task, ranks_per_task: the gang splits into equal tasks of equal ranks."""
    gpus = _int(body, "gpus")
    assert gpus is not None
    if gpus < 1:
        raise SpecError("gpus", f"must be >= 1, got {gpus}")

    given_per_task = _int(body, "gpus_per_task")
    gpus_per_task = (
        given_per_task
        if given_per_task is not None
        else _default_gpus_per_task(body, gpus, max_gpus_per_node)
    )
    if gpus_per_task < 1:
        raise SpecError("gpus_per_task", f"must be >= 1, got {gpus_per_task}")
    if gpus_per_task > max_gpus_per_node:
        raise SpecError(
            "gpus_per_task", f"must be <= {max_gpus_per_node} (GPUs per node), got {gpus_per_task}"
        )
    if gpus % gpus_per_task:
        if given_per_task is None:
            # The user never wrote gpus_per_task: say where the number came from and what would work.
            options = [d for d in range(max_gpus_per_node, 0, -1) if gpus % d == 0][:3]
            raise SpecError(
                "gpus_per_task",
                f"defaults to {gpus_per_task}, which does not divide gpus={gpus}; "
                f"set it explicitly (e.g. {' or '.join(map(str, options))})",
            )
        raise SpecError("gpus_per_task", f"{gpus_per_task} does not divide gpus={gpus}")

    given_ranks = _int(body, "ranks_per_task")
    ranks_per_task = given_ranks if given_ranks is not None else gpus_per_task
    if ranks_per_task < 1:
        raise SpecError("ranks_per_task", f"must be >= 1, got {ranks_per_task}")
    if gpus_per_task % ranks_per_task:
        # Every rank of a task gets the same number of GPUs (launch.py slices them evenly).
        raise SpecError("ranks_per_task", f"{ranks_per_task} does not divide gpus_per_task={gpus_per_task}")
    return gpus, gpus_per_task, ranks_per_task


def _elastic_sizes(body: Mapping[str, Any], gpus: int) -> list[int]:
    """The sizes an elastic body names (gpus, min_gpus, max_gpus, gpu_step), each one that is a positive
    integer: every one of them must be a whole number of tasks. Just ``[gpus]`` for a fixed-size job."""
    if body.get("min_gpus") is None and body.get("max_gpus") is None:
        return [gpus]
    named = (_int(body, field) for field in ("min_gpus", "max_gpus", "gpu_step"))
    return [gpus, *(size for size in named if size is not None and size >= 1)]


def _whole_task_size(sizes: Sequence[int], at_most: int) -> int:
    """The largest task size, at most ``at_most``, that divides every one of ``sizes``."""
    common = math.gcd(*sizes)
    small = [d for d in range(1, math.isqrt(common) + 1) if common % d == 0]
    return max(d for d in (*small, *(common // d for d in small)) if d <= at_most)


def _default_gpus_per_task(body: Mapping[str, Any], gpus: int, max_gpus_per_node: int) -> int:
    """One task of the whole gang, or of a full node when it is larger (``min(gpus, node size)``). An
    elastic gang must also take its other sizes in whole tasks: ``--gpus 8 --min-gpus 4 --max-gpus 16``
    runs as tasks of 4 GPUs rather than being refused for a task size its user never chose."""
    fixed = min(gpus, max_gpus_per_node)
    sizes = _elastic_sizes(body, gpus)
    if len(sizes) == 1 or all(size % fixed == 0 for size in sizes):
        return fixed
    return _whole_task_size(sizes, fixed)


def _whole_tasks_hint(sizes: Sequence[int], gpus_per_task: int) -> str:
    """How to make every size a whole number of tasks: the task size that would (a fixed one is the
    user's choice, so it is named, not applied)."""
    fits = _whole_task_size(sizes, gpus_per_task)
    named = ", ".join(map(str, sorted(set(sizes))))
    return f"; every size is a whole number of tasks: set gpus_per_task={fits} (it divides {named})"


def _check_command(body: Mapping[str, Any]) -> tuple[str, ...]:
    command = body.get("command")
    if not isinstance(command, list | tuple):
        raise SpecError("command", f"must be an array of strings, got {_type_name(command)}")
    if not command:
        raise SpecError("command", "must not be empty")
    if len(command) > MAX_COMMAND_ITEMS:
        raise SpecError("command", f"at most {MAX_COMMAND_ITEMS} elements, got {len(command)}")
    for i, arg in enumerate(command):
        if not isinstance(arg, str):
            raise SpecError("command", f"element {i} must be a string, got {_type_name(arg)}")
        _check_exec_string("command", f"element {i}", arg)
    if not command[0]:
        raise SpecError("command", "the program (element 0) must not be empty")
    _check_total("command", command, MAX_COMMAND_BYTES)
    return tuple(command)


def _check_exec_string(field: str, what: str, value: str) -> None:
    """A string that ends up in a rank's exec(): not longer than one exec string may be (a NUL, which
    would end it early, was refused with every other control character by ``check_strings``)."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ARG_BYTES:
        raise SpecError(field, f"{what} is {size} bytes; at most {MAX_ARG_BYTES}")


def _check_total(field: str, value: object, limit: int) -> None:
    size = len(msgspec.json.encode(value))
    if size > limit:
        raise SpecError(field, f"is {size} bytes as JSON; at most {limit}")


def _check_interactive(kind: str, priority: str, max_retries: int, elastic: bool) -> None:
    """An interactive session is one terminal a person types into: run again after a failure or resized,
    it would be a fresh shell nobody watches. Its class is for sessions alone: a batch job under it would
    be a training run no training may preempt."""
    if kind != "interactive":
        if priority == INTERACTIVE_PRIORITY:
            raise SpecError("priority", f"{INTERACTIVE_PRIORITY!r} is for interactive jobs alone (kind)")
        return
    if max_retries:
        raise SpecError("max_retries", "an interactive session is never retried; it takes no max_retries")
    if elastic:
        raise SpecError("kind", "an interactive session has a fixed size: no min_gpus or max_gpus")


#: Ports a job may publish: unprivileged ones, a few (a notebook, a dashboard, a debugger).
MIN_PORT, MAX_PORT, MAX_PORTS = 1024, 65535, 8


def _check_ports(body: Mapping[str, Any]) -> tuple[int, ...]:
    value = body.get("ports")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError("ports", f"must be an array of port numbers, got {_type_name(value)}")
    if odd := [p for p in value if not isinstance(p, int) or isinstance(p, bool)]:
        raise SpecError("ports", f"a port is an integer, got {_type_name(odd[0])}")
    if len(value) > MAX_PORTS or len(set(value)) != len(value):
        raise SpecError("ports", f"at most {MAX_PORTS} distinct ports, got {value}")
    if bad := [p for p in value if not MIN_PORT <= p <= MAX_PORT]:
        raise SpecError("ports", f"a port is {MIN_PORT}-{MAX_PORT} (no privileged ports), got {bad[0]}")
    return tuple(sorted(value))


def _check_priority(body: Mapping[str, Any], classes: Sequence[str], default: str) -> str:
    priority = _str(body, "priority")
    if priority is None:
        return default
    if priority not in classes:
        accepted = ", ".join(classes) or "none (this cluster defines no priority class)"
        raise SpecError("priority", f"{priority!r} is not a priority class here; one of {accepted}")
    return priority


def _check_env(body: Mapping[str, Any]) -> dict[str, str]:
    env = body.get("env")
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise SpecError("env", f"must be an object of strings, got {_type_name(env)}")
    if len(env) > MAX_ENV_VARS:
        raise SpecError("env", f"at most {MAX_ENV_VARS} variables, got {len(env)}")
    for key, value in env.items():
        if not isinstance(key, str) or len(key) > MAX_ENV_NAME_LENGTH or not ENV_NAME_PATTERN.fullmatch(key):
            shown = key if not isinstance(key, str) or len(key) <= 64 else f"{key[:64]}..."
            raise SpecError(
                "env", f"{shown!r} is not a valid environment variable name (at most {MAX_ENV_NAME_LENGTH})"
            )
        if not isinstance(value, str):
            raise SpecError("env", f"value of {key} must be a string, got {_type_name(value)}")
        _check_exec_string("env", f"value of {key}", value)
    _check_total("env", env, MAX_ENV_BYTES)
    return dict(env)


def check_secrets(body: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """The body's ``secrets`` (NAME -> value), each name a variable the rank will see with its value: no
    Rallypoint or torchrun name, none also in ``env``. A refusal names ``secrets.NAME``, never the value."""
    secrets = body.get("secrets")
    if secrets is None:
        return {}
    if not isinstance(secrets, Mapping):
        raise SpecError("secrets", f"must be an object of strings, got {_type_name(secrets)}")
    if len(secrets) > MAX_SECRETS:
        raise SpecError("secrets", f"at most {MAX_SECRETS} secrets, got {len(secrets)}")
    for name, value in secrets.items():
        _check_secret(str(name), value, env)
    _check_total("secrets", secrets, MAX_SECRETS_BYTES)
    return dict(secrets)


def _check_secret(name: str, value: object, env: Mapping[str, str]) -> None:
    field = f"secrets.{name}" if len(name) <= 64 else f"secrets.{name[:64]}..."
    if len(name) > MAX_ENV_NAME_LENGTH or not ENV_NAME_PATTERN.fullmatch(name):
        raise SpecError(field, f"not a valid environment variable name (at most {MAX_ENV_NAME_LENGTH})")
    # the contract overrides it in the rank: the secret would never be seen
    if name.startswith("RALLY_") or name in CONTRACT_VARIABLES:
        raise SpecError(field, "is a name Rallypoint sets in every rank; choose another")
    if name in env:
        raise SpecError(field, "is also in env; a variable is either plain or secret")
    if not isinstance(value, str):
        raise SpecError(field, f"must be a string, got {_type_name(value)}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_SECRET_BYTES:
        raise SpecError(field, f"is {size} bytes; at most {MAX_SECRET_BYTES}")


def _non_empty_optional(body: Mapping[str, Any], field: str) -> str | None:
    value = _str(body, field)
    if value is not None and not value:
        raise SpecError(field, "must not be empty (omit it instead)")
    if value is not None and len(value) > MAX_TEXT_LENGTH:
        raise SpecError(field, f"at most {MAX_TEXT_LENGTH} characters, got {len(value)}")
    return value


def _check_checkpoint_dir_shape(body: Mapping[str, Any]) -> str | None:
    """An absolute, normalized path: where it may lie is the cluster's to say (``check_checkpoint_dir``)."""
    path = _non_empty_optional(body, "checkpoint_dir")
    if path is None:
        return None
    if not path.startswith("/"):
        raise SpecError("checkpoint_dir", f"{path!r} is not an absolute path")
    # normpath folds '.', '..', '//' and a trailing '/'; it keeps a leading '//' (POSIX leaves its meaning
    # to the system), refused too. What is stored is what every rank and every reader sees: one spelling.
    if posixpath.normpath(path) != path or path.startswith("//"):
        raise SpecError(
            "checkpoint_dir",
            f"{path!r} is not normalized: no '.' or '..' component, no '//', no trailing '/'",
        )
    return path


def _check_gpu_types(body: Mapping[str, Any], gpu_type: str | None) -> tuple[str, ...] | None:
    value = body.get("gpu_types")
    if value is None:
        return None
    if gpu_type is not None:
        raise SpecError("gpu_types", "give gpu_type (one type) or gpu_types (several), not both")
    if not isinstance(value, list | tuple):
        raise SpecError("gpu_types", f"must be an array of strings, got {_type_name(value)}")
    if not value:
        raise SpecError("gpu_types", "must not be empty (omit it instead)")
    if len(value) > MAX_GPU_TYPES:
        raise SpecError("gpu_types", f"at most {MAX_GPU_TYPES} types, got {len(value)}")
    for i, t in enumerate(value):
        if not isinstance(t, str) or not t or len(t) > MAX_TEXT_LENGTH:
            shown = t if not isinstance(t, str) or len(t) <= 64 else f"{t[:64]}..."
            raise SpecError(
                "gpu_types",
                f"item {i} must be a non-empty string of at most {MAX_TEXT_LENGTH}, got {shown!r}",
            )
    if len(set(value)) != len(value):
        raise SpecError("gpu_types", "lists a type more than once")
    return tuple(value)


def _bool(body: Mapping[str, Any], field: str) -> bool:
    value = body.get(field)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SpecError(field, f"must be true or false, got {_type_name(value)}")
    return value


def _check_depends_on(body: Mapping[str, Any]) -> tuple[Dependency, ...]:
    """The jobs this one waits for: their shape only (whether each exists, is the team's and can still be
    met is the API's check, against its fold)."""
    value = body.get("depends_on")
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise SpecError("depends_on", f"must be an array of objects, got {_type_name(value)}")
    if len(value) > MAX_DEPENDENCIES:
        raise SpecError("depends_on", f"at most {MAX_DEPENDENCIES} dependencies, got {len(value)}")
    deps: list[Dependency] = []
    for i, item in enumerate(value):
        field = f"depends_on[{i}]"
        if not isinstance(item, Mapping):
            raise SpecError(field, f"must be an object {{kind, job_id}}, got {_type_name(item)}")
        unknown = sorted(str(k) for k in item if k not in ("kind", "job_id"))
        if unknown:
            raise SpecError(f"{field}.{unknown[0]}", "unknown field (a dependency has kind and job_id)")
        kind, job_id = item.get("kind"), item.get("job_id")
        if kind not in DEPENDENCY_KINDS:
            raise SpecError(f"{field}.kind", f"must be one of {', '.join(DEPENDENCY_KINDS)}, got {kind!r}")
        if not isinstance(job_id, str) or not TOKEN_PATTERN.fullmatch(job_id):
            raise SpecError(f"{field}.job_id", f"must be a job id, got {job_id!r}")
        deps.append(Dependency(kind=kind, job_id=job_id))
    if len(set(deps)) != len(deps):
        raise SpecError("depends_on", "lists a dependency more than once")
    return tuple(deps)


def _check_task_resources(body: Mapping[str, Any]) -> tuple[int, int]:
    """CPU (millicores) and host memory (MiB) per task: what its node must have left for it."""
    out: list[int] = []
    for field in ("cpu_milli", "memory_mib"):
        value = _int(body, field)
        if value is not None and value < 0:
            raise SpecError(field, f"must be >= 0, got {value}")
        out.append(value or 0)
    return out[0], out[1]


def _check_gpu_milli(
    body: Mapping[str, Any], gpus: int, ranks_per_task: int, min_gpus: int | None, max_gpus: int | None
) -> int | None:
    """A fraction of one GPU: one task, one rank, one GPU it shares; never elastic."""
    milli = _int(body, "gpu_milli")
    if milli is None:
        return None
    if not 1 <= milli < GPU_MILLI:
        raise SpecError(
            "gpu_milli",
            f"must be 1-{GPU_MILLI - 1} thousandths of one GPU, got {milli} (a whole GPU: omit gpu_milli)",
        )
    _one_shared_gpu("gpu_milli", gpus, ranks_per_task, min_gpus, max_gpus)
    return milli


def _one_shared_gpu(field: str, gpus: int, ranks: int, min_gpus: int | None, max_gpus: int | None) -> None:
    """A fractional job is one task of one rank on one GPU it shares; never elastic."""
    if gpus != 1:
        raise SpecError(field, f"a fraction of one GPU runs as gpus=1, got gpus={gpus}")
    if ranks != 1:
        raise SpecError(field, f"a fraction of one GPU runs one rank, got ranks_per_task={ranks}")
    if min_gpus is not None or max_gpus is not None:
        raise SpecError(field, "a fraction of one GPU cannot be elastic (min_gpus / max_gpus)")


#: The most GPU memory a fractional job may ask for: more than any GPU has (the scheduler finds none that
#: holds it and says so), small enough for any arithmetic on it.
MAX_GPU_MEMORY_MIB = 1 << 22  # 4 TiB


def _check_gpu_memory(
    body: Mapping[str, Any], gpus: int, ranks_per_task: int, min_gpus: int | None, max_gpus: int | None
) -> int | None:
    """GPU memory (MiB) of a fractional job's shared GPU; with or without ``gpu_milli``, not with MIG."""
    mem = _int(body, "gpu_memory_mib")
    if mem is None:
        return None
    if not 1 <= mem <= MAX_GPU_MEMORY_MIB:
        raise SpecError("gpu_memory_mib", f"must be 1-{MAX_GPU_MEMORY_MIB} MiB, got {mem}")
    if body.get("mig_profile") is not None:
        raise SpecError("gpu_memory_mib", "a MIG slice has its profile's memory: give mig_profile alone")
    _one_shared_gpu("gpu_memory_mib", gpus, ranks_per_task, min_gpus, max_gpus)
    return mem


#: A node label's key and value, and how many a selector may name (what Kubernetes allows a label value).
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$")
MAX_SELECTOR_LABELS = 32


def _check_node_selector(body: Mapping[str, Any]) -> dict[str, str]:
    """Labels (key -> value) every task's node must have."""
    value = body.get("node_selector")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError("node_selector", f"must be an object of strings, got {_type_name(value)}")
    if len(value) > MAX_SELECTOR_LABELS:
        raise SpecError("node_selector", f"at most {MAX_SELECTOR_LABELS} labels, got {len(value)}")
    for key, label in value.items():
        for what, text in (("key", key), ("value", label)):
            if not isinstance(text, str) or not LABEL_PATTERN.fullmatch(text):
                shown = text if not isinstance(text, str) or len(text) <= 64 else f"{text[:64]}..."
                raise SpecError(
                    "node_selector",
                    f"label {what} {shown!r} is not 1-63 letters, digits, '.', '_', '/' or '-'",
                )
    return dict(value)


def _check_kind(
    body: Mapping[str, Any], time_limit_s: int | None
) -> Literal["batch", "service", "interactive"]:
    """``batch`` (the default), ``service``, which runs until cancelled: no time limit, or
    ``interactive``, a terminal session (``_check_interactive``)."""
    kind = _str(body, "kind")
    if kind is None or kind == "batch":
        return "batch"
    if kind == "interactive":
        return "interactive"
    if kind != "service":
        raise SpecError("kind", f"{kind!r} is not a job kind; one of batch, service, interactive")
    if time_limit_s is not None:
        raise SpecError("kind", "a service runs until cancelled: it takes no time_limit_s")
    return "service"


def _check_mig_profile(
    body: Mapping[str, Any],
    gpus: int,
    ranks_per_task: int,
    min_gpus: int | None,
    max_gpus: int | None,
    gpu_milli: int | None,
) -> str | None:
    """A MIG slice: a profile some MIG-capable model offers; one task, one rank, one slice."""
    profile = _str(body, "mig_profile")
    if profile is None:
        return None
    # here, not at the top: importing the core (numpy) would slow every `rally` command (test_cli_wiring)
    from rallypoint.core.mig import MIG_PROFILES

    if profile not in MIG_PROFILES:
        raise SpecError(
            "mig_profile", f"{profile!r} is not a MIG profile; one of {', '.join(sorted(MIG_PROFILES))}"
        )
    if gpu_milli is not None:
        raise SpecError(
            "mig_profile", "give gpu_milli (a shared fraction) or mig_profile (a slice), not both"
        )
    if gpus != 1 or ranks_per_task != 1:
        raise SpecError("mig_profile", f"a MIG slice runs as gpus=1 with one rank, got gpus={gpus}")
    if min_gpus is not None or max_gpus is not None:
        raise SpecError("mig_profile", "a MIG slice cannot be elastic (min_gpus / max_gpus)")
    return profile


def _check_topology(body: Mapping[str, Any]) -> tuple[TopologyLevel | None, TopologyLevel | None]:
    levels: dict[str, str | None] = {}
    for field in ("topology_required", "topology_preferred"):
        value = _str(body, field)
        if value is not None and value not in TOPOLOGY_LEVELS:
            raise SpecError(field, f"{value!r} is not a topology level; one of {', '.join(TOPOLOGY_LEVELS)}")
        levels[field] = value
    required, preferred = levels["topology_required"], levels["topology_preferred"]
    if (
        required is not None
        and preferred is not None
        and (TOPOLOGY_LEVELS.index(preferred) > TOPOLOGY_LEVELS.index(required))
    ):
        raise SpecError(
            "topology_preferred",
            f"{preferred!r} is wider than topology_required={required!r}; a preference must be as narrow or "
            "narrower than the requirement",
        )
    # Both were checked against TOPOLOGY_LEVELS above, which is TopologyLevel's own list.
    return cast("TopologyLevel | None", required), cast("TopologyLevel | None", preferred)


def _check_elastic(
    body: Mapping[str, Any], gpus: int, gpus_per_task: int
) -> tuple[int | None, int | None, int | None]:
    """An elastic gang may run with min_gpus..max_gpus GPUs in steps of gpu_step; gpus is where it starts.

    Every size it may take must still split into whole tasks, so the step and both bounds are multiples
    of gpus_per_task. Omitted bounds default to gpus, the step to gpus_per_task.
    """
    min_gpus = _int(body, "min_gpus")
    max_gpus = _int(body, "max_gpus")
    gpu_step = _int(body, "gpu_step")
    if min_gpus is None and max_gpus is None:
        if gpu_step is not None:
            raise SpecError("gpu_step", "only meaningful for an elastic job (set min_gpus or max_gpus)")
        return None, None, None
    lo = gpus if min_gpus is None else min_gpus
    hi = gpus if max_gpus is None else max_gpus
    step = gpus_per_task if gpu_step is None else gpu_step
    if lo < 1:
        raise SpecError("min_gpus", f"must be >= 1, got {lo}")
    if lo > gpus:
        raise SpecError("min_gpus", f"{lo} is more than gpus={gpus}")
    if hi < gpus:
        raise SpecError("max_gpus", f"{hi} is less than gpus={gpus}")
    if step < 1:
        raise SpecError("gpu_step", f"must be >= 1, got {step}")
    hint = _whole_tasks_hint((gpus, lo, hi, step), gpus_per_task)
    if step % gpus_per_task:
        raise SpecError("gpu_step", f"{step} is not a multiple of gpus_per_task={gpus_per_task}{hint}")
    if lo % gpus_per_task:
        raise SpecError("min_gpus", f"{lo} is not a multiple of gpus_per_task={gpus_per_task}{hint}")
    if (gpus - lo) % step:
        raise SpecError(
            "gpu_step",
            f"gpus={gpus} is not reachable from min_gpus={lo} in steps of {step}; set gpu_step to a "
            f"multiple of gpus_per_task={gpus_per_task} that divides {gpus - lo} (e.g. {gpus_per_task})",
        )
    if (hi - lo) % step:
        raise SpecError(
            "max_gpus",
            f"{hi} is not reachable from min_gpus={lo} in steps of {step}; "
            f"set max_gpus={hi - (hi - lo) % step} or {hi - (hi - lo) % step + step}",
        )
    return lo, hi, step


# --- the request body, before it is decoded ---------------------------------------------------------

# A JSON string literal (escapes included), so that brackets inside strings are not counted.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(raw: bytes) -> int:
    """Deepest nesting of arrays and objects in a JSON text, found without decoding it."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def check_json_depth(raw: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse a body nested deeper than ``limit`` before any decoder recurses into it."""
    depth = json_depth(raw)
    if depth > limit:
        raise SpecError("body", f"JSON nested {depth} levels deep; at most {limit}")


class BodyError(SpecError):
    """A request body that is not acceptable JSON (HTTP 400); ``field`` is ``body``, or the string that
    is not valid UTF-8."""


def decode_json_body(raw: bytes) -> object:
    """The JSON value of a request body (None when it is empty), or ``BodyError`` saying what is wrong.

    Depth first (a decoder recursing into 3,000 nested arrays fails with RecursionError), then msgspec,
    which refuses invalid UTF-8 and lone surrogates; such a refusal is located (``_bad_text``) so that
    the answer names the field, not just a byte offset. Repeated keys last (``check_duplicate_keys``).
    """
    if not raw:
        return None
    try:
        check_json_depth(raw)
        decoded = msgspec.json.decode(raw)
        check_duplicate_keys(raw)
    except SpecError as err:
        raise BodyError(err.field, f"body is not acceptable JSON: {err.detail}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise _bad_text(raw) or BodyError("body", f"body is not valid JSON: {exc}") from None
    return decoded


def _bad_text(raw: bytes) -> BodyError | None:
    """The string of ``raw`` that is not valid UTF-8 (a bad byte or a lone surrogate), or None when the
    body is wrong in another way. Bad bytes decode to lone surrogates (surrogateescape), which the
    stdlib's parser keeps, as it keeps a lone ``\\ud800``; ``check_strings`` then finds the first."""
    try:
        check_strings(json.loads(raw.decode("utf-8", "surrogateescape")), fault=utf8_fault)
    except SpecError as err:
        return BodyError(err.field, err.detail)
    except ValueError:
        return None  # not JSON even when decoded leniently: msgspec's own message says where
    return None


class _Duplicate(msgspec.Struct, frozen=True):
    """Stands in for an object that repeats a key, carrying the key's path up to the top."""

    path: tuple[str, ...]


def _duplicate_in(value: Any) -> _Duplicate | None:
    # Arrays are built by the decoder itself, without a hook: look through them for a marker.
    if isinstance(value, _Duplicate):
        return value
    if isinstance(value, list):
        for index, item in enumerate(value):
            if (found := _duplicate_in(item)) is not None:
                return _Duplicate((str(index), *found.path))
    return None


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Duplicate:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if (found := _duplicate_in(value)) is not None:
            return _Duplicate((key, *found.path))
        if key in seen:
            return _Duplicate((key,))
        seen[key] = value
    return seen


def check_duplicate_keys(raw: bytes) -> None:
    """Refuse a JSON text whose objects repeat a key: decoders keep the last silently (msgspec too),
    so ``{"gpus": 8, "gpus": 64}`` would run what its author may not have meant. Call it on a text that
    already decoded (valid JSON, depth checked): it parses once more, in C but for the hook."""
    found = _duplicate_in(json.loads(raw, object_pairs_hook=_pairs))
    if found is not None:
        raise SpecError("body", f"duplicate key {'.'.join(found.path)!r} in the JSON body")


def check_checkpoint_dir(spec: JobSpec, checkpoint_root: str | None) -> None:
    """A job's own checkpoint folder lies in its team's folder of the cluster's checkpoint root.

    Anywhere else its ranks would write (and a restart would read) what is not theirs: ``/etc``, another
    team's folder, or another job's ``<root>/<job id>``, from which that job would then resume. No root
    (``None``): this API was given none, so a job may not name a folder at all.
    """
    if spec.checkpoint_dir is None:
        return
    if checkpoint_root is None:
        raise SpecError(
            "checkpoint_dir",
            "this cluster names no checkpoint root (the API's --checkpoint-root), so a job cannot choose "
            "its folder; leave checkpoint_dir out",
        )
    team_folder = posixpath.join(checkpoint_root, spec.team)
    if not spec.checkpoint_dir.startswith(team_folder + "/"):
        raise SpecError(
            "checkpoint_dir",
            f"{spec.checkpoint_dir!r} is not under {team_folder}/, the team's folder of the cluster's "
            "checkpoint root",
        )


def check_fits_cluster(spec: JobSpec, total_gpus: int, max_gpus_per_node: int) -> None:
    """Reject a job that could never run here, whatever else finishes: it would wait forever."""
    smallest = spec.min_gpus if spec.min_gpus is not None else spec.gpus
    if smallest > total_gpus:
        field = "min_gpus" if spec.min_gpus is not None else "gpus"
        raise SpecError(field, f"asks for {smallest} GPUs; the cluster has {total_gpus}")
    if spec.gpus_per_task > max_gpus_per_node:
        raise SpecError(
            "gpus_per_task",
            f"asks for {spec.gpus_per_task} GPUs per task; the largest node has {max_gpus_per_node}",
        )


# --- job ids --------------------------------------------------------------------------------------


#: What an Idempotency-Key (or a CloudEvent id standing in for one) may hold: printable ASCII, as HTTP
#: header values are; the OpenAPI document states the same pattern, so generated clients agree.
IDEMPOTENCY_KEY_PATTERN = f"^[ -~]{{1,{MAX_IDEMPOTENCY_KEY_LENGTH}}}$"
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)


def check_idempotency_key(key: str, field: str = "idempotency_key") -> str:
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise SpecError(field, f"must be 1-{MAX_IDEMPOTENCY_KEY_LENGTH} characters")
    # fullmatch: with match, the pattern's $ would let a key end in a newline.
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise SpecError(field, "must contain only printable ASCII characters")
    return key


def job_id_for(team: str, idempotency_key: str) -> str:
    """The id a (team, key) pair always maps to, so a retried submission finds the job it created.

    The team is part of the hash: two teams choosing the same key (say a CI build number) get two jobs.
    48 bits of sha256 keep ids short for humans while collisions stay negligible at any realistic
    number of jobs; the id is a valid subject token by construction.
    """
    check_idempotency_key(idempotency_key)
    digest = hashlib.sha256(f"{team}\x00{idempotency_key}".encode()).hexdigest()
    job_id = f"j-{digest[:12]}"
    assert TOKEN_PATTERN.match(job_id)
    return job_id


def new_job_id() -> str:
    """A random id for a submission without an idempotency key (a retry of it makes a second job)."""
    return f"j-{secrets.token_hex(6)}"
