"""The OpenAPI 3.1 description of the API, written by hand next to the handlers it describes.

Hand-written rather than generated: the routes are few, and a document that reads well matters more to
the CI systems integrating with us than a generator dependency. ``tests/integration/test_api.py`` checks
that every route the app serves is listed here, so the two cannot drift silently.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, get_args

from rallypoint.core.mig import MIG_PROFILES
from rallypoint.jobs import DEFAULT_PRIORITY, PRIORITY_CLASSES, TOPOLOGY_LEVELS
from rallypoint.jobs.arrays import ARRAY_PATTERN
from rallypoint.jobs.placement_rules import GROUP_PATTERN, TAINT_PATTERN
from rallypoint.jobs.text import CLEAN_TEXT_PATTERN, FORBIDDEN, FREE_TEXT_PATTERN
from rallypoint.jobs.validate import (
    IDEMPOTENCY_KEY_PATTERN,
    LABEL_PATTERN,
    MAX_ARG_BYTES,
    MAX_COMMAND_BYTES,
    MAX_COMMAND_ITEMS,
    MAX_CPU_MILLI,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_LENGTH,
    MAX_ENV_VARS,
    MAX_GPUS,
    MAX_JSON_DEPTH,
    MAX_MEMORY_MIB,
    MAX_SECRET_BYTES,
    MAX_SECRETS,
    MAX_SECRETS_BYTES,
    MAX_TEXT_LENGTH,
    MAX_TIME_LIMIT_S,
)
from rallypoint.state import JobState

from .auth import with_security
from .dashboard import dashboard_paths
from .dryrun import dry_run_ok, dry_run_parameter, dry_run_schemas
from .history_openapi import comma_list, history_paths, history_schemas
from .predictions import predictions_paths, predictions_schemas
from .reads import document_fold_read
from .terminal import terminal_paths
from .why import why_paths, why_schemas

_JOB_STATES = list(get_args(JobState))


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": _ref("Problem")}}}


def _json(description: str, schema: dict[str, Any], headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


# A team token beyond its queue file's max_pending_jobs or submissions_per_minute (services/api/fairuse.py).
_FAIR_USE_LIMIT: dict[str, Any] = {
    **_problem(
        "Beyond a fair-use limit of the team's queue file (the problem's limit: max_pending_jobs or "
        "submissions_per_minute); nothing was appended. A retry of an accepted submission is never refused."
    ),
    "headers": {
        "Retry-After": {
            "description": "Seconds to wait before submitting again.",
            "schema": {"type": "integer"},
        }
    },
}


def _fold_read(operation: dict[str, Any]) -> dict[str, Any]:
    """A read answered from this API's fold: ``stale``, the read headers, its 400 and 503."""
    return document_fold_read(operation, _problem)


_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_NUM = {"type": ["number", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}
#: One gang's plan on a node going out of service (``rallypoint.control.drain.DrainPlan``).
_DRAIN_PLAN: dict[str, Any] = {
    "plan": {
        "type": "string",
        "enum": ["now", "after-checkpoint", "at-deadline"],
        "description": "now: interrupted at once; after-checkpoint: right after its next committed "
        "checkpoint, at the latest at the deadline; at-deadline: at the deadline (it has no checkpoint to "
        "wait for), or never when the deadline is null (its class runs to its end).",
    },
    "deadline": {**_NULLABLE_NUM, "description": "Unix seconds by which it leaves the node at the latest."},
    "detail": {"type": "string", "description": "Why this plan, in words."},
}
_TOPOLOGY = {"type": ["string", "null"], "enum": [*TOPOLOGY_LEVELS, None]}
# Limits (docs/api.md, "Limits"): the validator enforces the same numbers, and byte limits in UTF-8.
_GPU_COUNT = {"minimum": 1, "maximum": MAX_GPUS}
_NULLABLE_GPUS = {**_NULLABLE_INT, **_GPU_COUNT}
# Text (docs/api.md, "Text"; rallypoint.jobs.text): no control character, no lone surrogate, no bidi
# formatting character; free text (command arguments, env values, reasons) may hold a tab and a newline.
_CLEAN_TEXT = {"pattern": CLEAN_TEXT_PATTERN}
_NULLABLE_TEXT = {**_NULLABLE_STR, "maxLength": MAX_TEXT_LENGTH, **_CLEAN_TEXT}
_EXEC_STRING = {
    "type": "string",
    "maxLength": MAX_ARG_BYTES,
    "pattern": FREE_TEXT_PATTERN,
    "description": f"At most {MAX_ARG_BYTES} UTF-8 bytes; free text: no control character but a tab "
    "or a newline.",
}

_SECRETS = {
    "type": ["object", "null"],
    "writeOnly": True,
    "maxProperties": MAX_SECRETS,
    "additionalProperties": {
        "type": "string",
        "maxLength": MAX_SECRET_BYTES,
        "pattern": FREE_TEXT_PATTERN,
        "description": f"At most {MAX_SECRET_BYTES} UTF-8 bytes; free text.",
    },
    # not RALLY_* nor a torchrun contract name (the validator names them), and none also in env
    "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": MAX_ENV_NAME_LENGTH},
    "description": "Secret environment variables of every rank: kept outside the event log, given to "
    "the job's own ranks only, never shown (a job shows their names, secret_names). At most "
    f"{MAX_SECRETS_BYTES} bytes as JSON in all. A retry with the same Idempotency-Key must send the same "
    "values (409 otherwise).",
}

# What a client can do with the job it just submitted (OpenAPI links: generated clients, and the
# stateful run of tests/integration/test_api_schemathesis.py, follow them).
_JOB_LINKS = {
    name: {"operationId": operation, "parameters": {"job_id": "$response.body#/job_id"}}
    for name, operation in [
        ("GetJob", "getJob"),
        ("CancelJob", "cancelJob"),
        ("ListJobCheckpoints", "listJobCheckpoints"),
        ("GetJobHistory", "getJobHistory"),
        ("GetJobLogs", "getJobLogs"),
    ]
}


def _priority_schema(classes: Sequence[str], default: str) -> dict[str, Any]:
    return {
        "type": ["string", "null"],
        "enum": [*classes, None],
        "default": default,
        "description": "One of this cluster's priority classes (its queue file's, else the built-in "
        "ones), most important first. Left out: the cluster's default class.",
    }


# Free text with a character that is not blank (node_ops.BLANK: its \r, \v and \f are refused anyway).
_NOT_BLANK_FREE_TEXT = f"^[^{FORBIDDEN}]*[^{FORBIDDEN}\\t\\n ][^{FORBIDDEN}]*$"

# One component of a normalized path: not empty, not '.' or '..', no '/', clean text (no lookahead: not
# every JSON Schema validator has one).
_OTHER = f"{FORBIDDEN}\\t\\n/"
_PATH_COMPONENT = f"(?:[^.{_OTHER}][^{_OTHER}]*|\\.[^.{_OTHER}][^{_OTHER}]*|\\.\\.[^{_OTHER}]+)"
_TEAM = "[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?"


def _checkpoint_dir_schema(root: str | None) -> dict[str, Any]:
    """What ``check_checkpoint_dir`` accepts: a normalized path below ROOT/<team>/ (the team's own is
    the one rule left unstated); only null when this API has no root."""
    if root is None:
        return {
            "type": "null",
            "description": "This API has no checkpoint root (--checkpoint-root), so a job cannot name "
            "its checkpoint folder.",
        }
    # re.escape would also escape characters such as '-', which ECMA 262's unicode mode refuses.
    syntax = re.sub(r"([\\^$.|?*+()\[\]{}/])", r"\\\1", root)
    return {
        **_NULLABLE_TEXT,
        "minLength": 1,
        "pattern": f"^{syntax}/{_TEAM}(?:/{_PATH_COMPONENT})+$",
        "description": f"An absolute, normalized path (no '.' or '..' component, no '//', no trailing "
        f"'/') in the team's folder of the cluster's checkpoint root: {root}/<team>/... Left out: "
        f"{root}/<job id>, the job controller's.",
    }


_SCHEMAS: dict[str, Any] = {
    "JobSpec": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "gpus", "command"],
        # one GPU type or several, not both
        "not": {
            "required": ["gpu_type", "gpu_types"],
            "properties": {"gpu_type": {"type": "string"}, "gpu_types": {"type": "array"}},
        },
        "properties": {
            "name": {"type": "string", "pattern": r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"},
            "team": {
                "type": "string",
                "pattern": r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$",
                "description": "Default: the token's team; another team than the token's is a 403. "
                "Required with an admin token.",
            },
            "gpus": {"type": "integer", **_GPU_COUNT, "description": "Size of the gang: all or nothing."},
            "gpus_per_task": {
                "type": ["integer", "null"],
                **_GPU_COUNT,
                "description": "GPUs of one task (one node). Default min(gpus, GPUs per node); "
                "must divide gpus.",
            },
            "ranks_per_task": {
                "type": ["integer", "null"],
                **_GPU_COUNT,
                "description": "Processes per task. Default gpus_per_task; must divide it.",
            },
            "command": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_COMMAND_ITEMS,
                # the program (element 0) must not be empty; its arguments may be
                "prefixItems": [{**_EXEC_STRING, "minLength": 1}],
                "items": _EXEC_STRING,
                "description": f"At most {MAX_COMMAND_BYTES} bytes as JSON in all.",
            },
            "priority": _priority_schema(PRIORITY_CLASSES, DEFAULT_PRIORITY),
            "env": {
                "type": ["object", "null"],
                "maxProperties": MAX_ENV_VARS,
                "additionalProperties": _EXEC_STRING,
                "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": MAX_ENV_NAME_LENGTH},
                "description": f"At most {MAX_ENV_BYTES} bytes as JSON in all.",
            },
            "time_limit_s": {
                "type": ["integer", "null"],
                "exclusiveMinimum": 0,
                "maximum": MAX_TIME_LIMIT_S,
                "description": "Seconds; at most one year.",
            },
            "gpu_type": {**_NULLABLE_TEXT, "minLength": 1, "description": "Not with gpu_types."},
            "gpu_types": {
                "type": ["array", "null"],
                "minItems": 1,
                "maxItems": 16,
                "uniqueItems": True,
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_LENGTH, **_CLEAN_TEXT},
                "description": "Several acceptable GPU types, most preferred first; not with gpu_type.",
            },
            "topology_required": _TOPOLOGY,
            "topology_preferred": {**_TOPOLOGY, "description": "No wider than topology_required."},
            "min_gpus": {**_NULLABLE_GPUS, "description": "Elastic jobs: smallest size (default gpus)."},
            "max_gpus": {**_NULLABLE_GPUS, "description": "Elastic jobs: largest size (default gpus)."},
            "gpu_step": {
                **_NULLABLE_GPUS,
                "description": "Elastic jobs: size step, a multiple of gpus_per_task.",
            },
            "checkpoint_dir": _checkpoint_dir_schema(None),
            "max_retries": {"type": ["integer", "null"], "minimum": 0, "maximum": 100, "default": 0},
            "depends_on": {
                "type": ["array", "null"],
                "maxItems": 64,
                "uniqueItems": True,
                "items": _ref("Dependency"),
                "description": "Jobs of the same team this one waits for before it is scheduled; each must "
                "exist and still be able to meet its kind, else 422 naming depends_on[i].job_id.",
            },
            "array": {
                "type": ["string", "null"],
                "pattern": ARRAY_PATTERN,
                "maxLength": 4096,
                "description": "An array: one job per index (0-99, 1,3,5-7, 0-30:10), at most 1,000, each "
                "with RALLY_ARRAY_INDEX; %N: at most N hold GPUs at once. The 202 then has array_id and "
                "job_ids (<array id>_<index>). Not with secrets.",
            },
            "singleton": {
                "type": ["boolean", "null"],
                "default": False,
                "description": "Wait until every earlier job of the team with this name has ended.",
            },
            "cpu_milli": {
                "type": ["integer", "null"],
                "minimum": 0,
                "maximum": MAX_CPU_MILLI,
                "default": 0,
                "description": "CPU per task, in millicores (1000 = one core), its node must have left.",
            },
            "memory_mib": {
                "type": ["integer", "null"],
                "minimum": 0,
                "maximum": MAX_MEMORY_MIB,
                "default": 0,
                "description": "Host memory per task, in MiB, its node must have left.",
            },
            "gpu_milli": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": 999,
                "description": "A fraction of one GPU in thousandths (250 = a quarter), shared with other "
                "fractional jobs: needs gpus=1 and one rank, not elastic. Omit for whole GPUs.",
            },
            "gpu_memory_mib": {
                "type": ["integer", "null"],
                "minimum": 1,
                "maximum": 1 << 22,
                "description": "GPU memory in MiB a fractional job needs on its shared GPU: its share "
                "there is the larger of gpu_milli and this memory's part of the GPU's (the allocation's "
                "milli says which it got). Alone it makes the job fractional; the same one-GPU rules; not "
                "with mig_profile.",
            },
            "node_selector": {
                "type": ["object", "null"],
                "maxProperties": 32,
                "propertyNames": {"pattern": LABEL_PATTERN.pattern},
                "additionalProperties": {"type": "string", "pattern": LABEL_PATTERN.pattern},
                "description": "Labels every task's node must have (its agent's --label), e.g. zone: a.",
            },
            "tolerations": {
                "type": ["array", "null"],
                "maxItems": 16,
                "items": {"type": "string", "pattern": TAINT_PATTERN.pattern},
                "description": "Taints of nodes the job may run on: key=value, or key for any value. A "
                "tainted node (its agent's --taint) takes only jobs that tolerate all of its taints.",
            },
            "affinity": {
                "type": ["array", "null"],
                "maxItems": 8,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["group"],
                    "properties": {
                        "group": {"type": "string", "pattern": GROUP_PATTERN.pattern},
                        "level": {"type": "string", "enum": ["node", "rack"], "default": "node"},
                        "anti": {"type": "boolean", "default": False},
                    },
                },
                "description": "Rules between the job and other running jobs of its team, one per group: "
                "on a node (or rack) holding a member of group (anywhere while none runs), or with anti "
                "never on one (two replicas never in one rack). The job is a member of every group it names.",
            },
            "kind": {
                "type": ["string", "null"],
                "enum": ["batch", "service", None],
                "default": "batch",
                "description": "service: runs until cancelled, restarted whenever its ranks exit (after the "
                "retry backoff), never preempted; no time_limit_s. batch: runs to completion.",
            },
            "mig_profile": {
                "type": ["string", "null"],
                "enum": [*sorted(MIG_PROFILES), None],
                "description": "A MIG slice of this profile on a GPU in MIG mode (docs/sharing.md): needs "
                "gpus=1 and one rank, not with gpu_milli, not elastic. The node's GPU model must offer it.",
            },
            "secrets": _SECRETS,
            "secret_names": {
                "type": "array",
                "items": {"type": "string"},
                "readOnly": True,
                "description": "The names of the job's secrets, as a job is shown; never their values.",
            },
        },
    },
    "Dependency": {
        "type": "object",
        "required": ["kind", "job_id"],
        "additionalProperties": False,
        "properties": {
            "kind": {
                "type": "string",
                "enum": ["after", "after-ok", "after-not-ok", "after-any"],
                "description": "after: once it was placed (given its GPUs); after-ok: once it completed; "
                "after-not-ok: once it failed, was cancelled or rejected; after-any: once it ended.",
            },
            "job_id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"},
        },
    },
    "CloudEvent": {
        "type": "object",
        "description": "CloudEvents 1.0 structured mode; `id` is the idempotency key unless the "
        "Idempotency-Key header is sent.",
        "required": ["specversion", "id", "source", "type", "data"],
        "properties": {
            "specversion": {"const": "1.0"},
            "id": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
            "source": {"type": "string", "minLength": 1, **_CLEAN_TEXT},
            "type": {
                "type": "string",
                "minLength": 1,
                **_CLEAN_TEXT,
                "examples": ["io.rallypoint.job.submit"],
            },
            "data": _ref("JobSpec"),
        },
        # extension attributes: CloudEvents' type system has primitives only; every string is clean text
        "propertyNames": {"pattern": CLEAN_TEXT_PATTERN},
        "additionalProperties": {"type": ["string", "number", "boolean", "null"], **_CLEAN_TEXT},
    },
    "Accepted": {
        "type": "object",
        "required": ["job_id", "seq", "state", "links"],
        "properties": {
            "job_id": {"type": "string", "description": "The job's id; an array's first member's."},
            "array_id": {"type": "string", "description": "An array's id (only for an array)."},
            "job_ids": {"type": "array", "items": {"type": "string"}, "description": "An array's members."},
            "seq": {"type": "integer", "description": "Stream sequence of the job's JobSubmitted event."},
            "state": {"type": "string", "enum": _JOB_STATES},
            "links": {"type": "object", "properties": {"self": {"type": "string"}}},
        },
    },
    "CancelAccepted": {
        "type": "object",
        "properties": {
            "job_id": {"type": "string"},
            "seq": {"type": "integer", "description": "Stream sequence of the JobCancelRequested event."},
            "state": {"type": "string", "enum": _JOB_STATES},
            "cancel_requested": {"const": True},
            "links": {"type": "object"},
        },
    },
    "SuspendAccepted": {
        "type": "object",
        "properties": {
            "job_id": {"type": "string"},
            "seq": {"type": "integer", "description": "Stream sequence of the appended event."},
            "state": {"type": "string", "enum": _JOB_STATES},
            "suspend_requested": {"type": "boolean"},
            "links": {"type": "object"},
        },
    },
    "Placement": {
        "type": "object",
        "properties": {
            "task": {"type": "integer"},
            "node_id": {"type": "string"},
            "gpus": {"type": "array", "items": {"type": "integer"}},
            "mig": {
                "type": "object",
                "properties": {"profile": {"type": "string"}, "start": {"type": "integer"}},
                "description": "A MIG job's slice of its one GPU: its profile and first memory slice.",
            },
            "milli": {
                "type": "integer",
                "description": "A fractional job that asked for GPU memory: the thousandths of its GPU it "
                "holds.",
            },
        },
    },
    "Job": {
        "type": "object",
        "properties": {
            "job_id": {"type": "string"},
            "name": {"type": "string"},
            "team": {"type": "string"},
            "priority": {"type": "string"},
            "state": {"type": "string", "enum": _JOB_STATES},
            "attempt": {"type": "integer"},
            "queue": _NULLABLE_STR,
            "gpus": {"type": "integer"},
            "gpus_per_task": {"type": "integer"},
            "ranks_per_task": {"type": "integer"},
            "world_size": {"type": "integer"},
            "depends_on": {"type": "array", "items": _ref("Dependency")},
            "singleton": {"type": "boolean"},
            "cpu_milli": {"type": "integer"},
            "memory_mib": {"type": "integer"},
            "gpu_milli": _NULLABLE_INT,
            "mig_profile": _NULLABLE_STR,
            "array": {
                "type": ["object", "null"],
                "description": "The array this job is a member of: array_id, index, count, max_running.",
                "properties": {
                    "array_id": {"type": "string"},
                    "index": {"type": "integer"},
                    "count": {"type": "integer"},
                    "max_running": _NULLABLE_INT,
                },
            },
            "pending_reason": {
                "type": ["object", "null"],
                "properties": {
                    "code": {"type": "string", "examples": ["Resources", "Topology", "QuotaExceeded"]},
                    "message": {
                        "type": "string",
                        "description": "With numbers, ending in how many jobs are ahead (Slurm/Kueue style).",
                    },
                    "jobs_ahead": {
                        **_NULLABLE_INT,
                        "description": "Jobs before this one in the scheduler's order, as the message says.",
                    },
                    "updated_at": {
                        **_NULLABLE_NUM,
                        "description": "Unix seconds when the scheduler last wrote this reason.",
                    },
                },
            },
            "queue_position": {
                **_NULLABLE_INT,
                "description": "1-based place in the scheduler's order (jobs_ahead + 1); null until the "
                "scheduler has given the job a reason.",
            },
            "allocation": {"type": "array", "items": _ref("Placement")},
            "nodes": {"type": "array", "items": {"type": "string"}},
            "submitted_at": {"type": "number", "description": "Unix seconds."},
            "bound_at": _NULLABLE_NUM,
            "started_at": _NULLABLE_NUM,
            "ended_at": _NULLABLE_NUM,
            "exit_code": _NULLABLE_INT,
            "reason": {
                **_NULLABLE_STR,
                "description": "Why the job is in its current state (pending again, repairing, failed...); "
                "null once it runs again: see last_interruption.",
            },
            "last_interruption": {
                **_NULLABLE_STR,
                "description": "Why its last attempt was interrupted (a lost or drained node), once it "
                "runs again or completed.",
            },
            "drain": {
                "type": ["object", "null"],
                "description": "While a node under the job is out of service (drained or cordoned): what "
                "happens to the job there and by when, under the job controller's drain policy.",
                "properties": {
                    "node": {"type": "string"},
                    "reason": {"type": "string", "description": "Why the node is out of service."},
                    **_DRAIN_PLAN,
                },
            },
            "predicted_start": {
                "type": ["object", "null"],
                "description": "While the job waits: when it is predicted to start (docs/prediction.md), "
                "from "
                "the predictor service's latest run of the live cluster forward under the scheduler's own "
                "policy; null once the job is no longer pending.",
                "properties": {
                    "status": {
                        "type": "string",
                        "enum": [
                            "predicted",
                            "estimated",
                            "beyond-horizon",
                            "pending-refresh",
                            "unavailable",
                        ],
                    },
                    "basis": {
                        "type": "string",
                        "enum": ["forecast"],
                        "description": "A dry run's start fitted into the predictor's last forecast (status "
                        "estimated), its own run forward taking too long; absent for a run forward's.",
                    },
                    "forecast_seq": {"type": "integer", "description": "The log position of that forecast."},
                    "forecast_at": {"type": "number", "description": "Unix seconds it was made at."},
                    "p50": {
                        **_NULLABLE_NUM,
                        "description": "Unix seconds, if jobs run their median runtimes.",
                    },
                    "p90": {**_NULLABLE_NUM, "description": "Unix seconds, if jobs run their P90 runtimes."},
                    "runtime_p50_s": {"type": "number", "description": "This job's own estimated runtime."},
                    "runtime_from": {"type": "string", "description": "The history it was estimated from."},
                    "horizon_s": {"type": "number"},
                    "computed_at": {"type": "number", "description": "Unix seconds of the prediction."},
                    "computed_at_seq": {"type": "integer", "description": "The log position it saw."},
                    "policy": {"type": "string"},
                    "detail": {"type": "string"},
                },
            },
            "cancel_requested": {"type": "boolean"},
            "suspend_requested": {
                "type": "boolean",
                "description": "A suspend was asked for and has not taken effect yet (docs/api.md, Suspend).",
            },
            "suspended_s": {"type": "number", "description": "Seconds spent suspended, earlier suspensions."},
            "preemptions": {"type": "integer", "description": "Times this job was preempted and requeued."},
            "last_preempted_at": _NULLABLE_NUM,
            "preempting_for": {**_NULLABLE_STR, "description": "Job this one is being stopped for."},
            "recovery": _ref("Recovery"),
            "submitted_seq": {"type": "integer"},
            "last_seq": {"type": "integer"},
            "spec": _ref("JobSpec"),
            "links": {"type": "object"},
        },
    },
    "Recovery": {
        "type": "object",
        "description": "Failed attempts so far and what they cost; every restart resumes from the latest "
        "complete checkpoint.",
        "properties": {
            "user_failures": {"type": "integer", "description": "Attempts ended by a rank exiting non-zero."},
            "infra_failures": {
                "type": "integer",
                "description": "Attempts ended by a failed node or agent; these never use max_retries.",
            },
            "max_retries": {"type": "integer"},
            "retry_at": {**_NULLABLE_NUM, "description": "A retried job is not bound before this time."},
            "failed_nodes": {"type": "array", "items": {"type": "string"}},
            "interrupted_at": {**_NULLABLE_NUM, "description": "Since when a repairing gang waits."},
            "lost_gpu_s": {"type": "number", "description": "GPU-seconds of work redone after failures."},
            "resume_step": {**_NULLABLE_INT, "description": "Step the current attempt resumed from."},
            "latest_checkpoint_step": _NULLABLE_INT,
            "attempts": {"type": "array", "items": {"type": "string"}, "description": "Why each ended."},
        },
    },
    "JobList": {
        "type": "object",
        "properties": {
            "jobs": {"type": "array", "items": _ref("Job")},
            "count": {"type": "integer"},
            "next_after": {**_NULLABLE_INT, "description": "Pass as ?after= for the next page."},
            "seq": {"type": "integer"},
        },
    },
    "Node": {
        "type": "object",
        "properties": {
            "node_id": {"type": "string"},
            "address": {"type": "string"},
            "rack": {"type": "string"},
            "spine": {"type": "string"},
            "status": {"type": "string", "enum": ["up", "unreachable", "drained", "lost"]},
            "status_reason": _NULLABLE_STR,
            "health": {
                "type": "string",
                "enum": ["healthy", "suspect", "degraded", "failed"],
                "description": "The health monitor's verdict on the node's signals: degraded cordons it "
                "(no new work), failed drains it (docs/health.md).",
            },
            "health_since": {**_NULLABLE_NUM, "description": "When the verdict was reached."},
            "health_evidence": {"type": "array", "items": _ref("HealthEvidence")},
            "schedulable": {"type": "boolean", "description": "New work may land on it."},
            "gpu_type": {"type": "string"},
            "gpus": {
                "type": "object",
                "properties": {
                    "total": {"type": "integer"},
                    "free": {"type": "integer"},
                    "allocated": {"type": "integer"},
                },
            },
            "busy_gpus": {
                "type": "array",
                "items": {"type": "integer"},
                "description": "Indexes of the GPUs a job holds, any team's.",
            },
            "shared_gpus": {
                "type": "object",
                "additionalProperties": {"type": "integer"},
                "description": "GPU index -> thousandths of it that fractional jobs hold (any team's).",
            },
            "mig_gpus": {
                "type": "object",
                "additionalProperties": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"profile": {"type": "string"}, "start": {"type": "integer"}},
                    },
                },
                "description": "GPU index (in MIG mode) -> the MIG slices held on it (any team's).",
            },
            "labels": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "The node's labels, which jobs' node_selector match.",
            },
            "taints": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The node's taints: only jobs whose tolerations match all of them run here.",
            },
            "cpu_milli": {"type": "integer", "description": "CPU of the node, in millicores."},
            "memory_mib": {"type": "integer", "description": "Host memory of the node, in MiB."},
            "jobs": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The jobs on the node: all for an admin, the own team's for a team token.",
            },
            "draining_jobs": {
                "type": "array",
                "description": "While the node is out of service: each of its jobs (that the token may "
                "see) with its drain plan.",
                "items": {"type": "object", "properties": {"job_id": {"type": "string"}, **_DRAIN_PLAN}},
            },
            "registered_at": {"type": "number"},
        },
    },
    "HealthEvidence": {
        "type": "object",
        "description": "One finding behind a health verdict: value of signal on subject against threshold "
        "over window_s seconds (0: one sample).",
        "properties": {
            "signal": {"type": "string"},
            "subject": {"type": "string"},
            "severity": {"type": "string", "enum": ["suspect", "degraded", "failed"]},
            "value": {"type": "number"},
            "threshold": {"type": "number"},
            "window_s": {"type": "number"},
            "hard": {"type": "boolean"},
        },
    },
    "NodeAction": {
        "type": "object",
        "additionalProperties": False,
        "required": ["reason"],
        "properties": {
            "reason": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1000,
                "pattern": _NOT_BLANK_FREE_TEXT,
                "description": "Why (recorded in the event log with the token's user); not blank; free "
                "text: no control character but a tab or a newline.",
            }
        },
    },
    "NodeActionDone": {
        "type": "object",
        "properties": {
            "node": _ref("Node"),
            "seq": {"type": "integer", "description": "Stream sequence of the appended event."},
            "action": {"type": "string", "enum": ["drain", "undrain"]},
            "changed": {
                "type": "boolean",
                "description": "false: an undrain of a node already up; nothing was appended.",
            },
        },
    },
    "NodeList": {
        "type": "object",
        "properties": {
            "nodes": {"type": "array", "items": _ref("Node")},
            "count": {"type": "integer"},
            "seq": {"type": "integer"},
        },
    },
    "Checkpoint": {
        "type": "object",
        "properties": {
            "step": {"type": "integer"},
            "attempt": {"type": "integer", "description": "The job attempt that saved it."},
            "path": {"type": "string", "description": "The step's folder; its manifest is manifest.json."},
            "bytes": {"type": "integer"},
            "shards": {"type": "integer"},
            "save_s": {"type": "number", "description": "Seconds the save took."},
            "committed_at": {"type": "number", "description": "Unix seconds."},
            "manifest_sha256": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["committed", "verified", "corrupt", "deleted"],
                "description": "committed: awaiting the checkpoint service's verification.",
            },
            "error": {**_NULLABLE_STR, "description": "Why it is corrupt, or why it was deleted."},
        },
    },
    "CheckpointList": {
        "type": "object",
        "properties": {
            "job_id": {"type": "string"},
            "checkpoints": {
                "type": "array",
                "items": _ref("Checkpoint"),
                "description": "Oldest step first.",
            },
            "latest_complete": {
                **_NULLABLE_INT,
                "description": "Step of the newest complete (committed or verified) checkpoint: what a "
                "restart resumes from.",
            },
            "links": {"type": "object"},
            "seq": {"type": "integer", "description": "Last stream sequence folded."},
        },
    },
    "State": {
        "type": "object",
        "required": ["seq", "hash"],
        "properties": {
            "seq": {"type": "integer", "description": "Last stream sequence folded."},
            "hash": {
                "type": "string",
                "description": "ClusterState.hash(): sha256 hex; equals `rally replay --to seq`.",
            },
        },
    },
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details.",
        "required": ["type", "title", "status", "detail"],
        "properties": {
            "type": {"type": "string", "format": "uri"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "field": {"type": "string", "description": "The offending field (validation problems)."},
            "invalid_params": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "reason": {"type": "string"}},
                },
            },
        },
    },
}

_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_NODE_ID = {"name": "node_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _node_action_paths() -> dict[str, Any]:
    """POST /v1/nodes/{node_id}/drain and /undrain (services/api/node_ops.py; docs/health.md)."""
    paths: dict[str, Any] = {}
    for action, summary, done, conflict in [
        (
            "drain",
            "Drain a node: no new work on it; its running gangs are interrupted and repaired (admin only)",
            "NodeDrained appended; the node as this API's fold now shows it.",
            "The node is lost, or its state kept changing; nothing was appended.",
        ),
        (
            "undrain",
            "Return a drained node to service (admin only)",
            "NodeUndrained appended; the node as this API's fold now shows it.",
            "The node is lost or unreachable; nothing was appended.",
        ),
    ]:
        paths[f"/v1/nodes/{{node_id}}/{action}"] = {
            "parameters": [_NODE_ID],
            "post": {
                "operationId": f"{action}Node",
                "summary": summary,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("NodeAction")}},
                },
                "responses": {
                    "200": _json(done, _ref("NodeActionDone")),
                    "400": _problem("Body is not JSON."),
                    "403": _problem("The token is not an admin's."),
                    "404": _problem("Unknown node."),
                    "409": _problem(conflict),
                    "422": _problem("No reason, a blank one, or one over 1000 characters (`field`: reason)."),
                    "503": _problem("The event log did not acknowledge, or the node's state kept changing."),
                },
            },
        }
    return paths


def _node_rules_path() -> dict[str, Any]:
    """PUT /v1/nodes/{node_id}/rules (services/api/node_rules.py; docs/api.md "Placement rules")."""
    part = GROUP_PATTERN.pattern
    body = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "labels": {
                "type": ["object", "null"],
                "maxProperties": 32,
                "propertyNames": {"pattern": part},
                "additionalProperties": {"type": "string", "pattern": part},
                "description": "Labels on top of the agent's (the operator's wins for the same key).",
            },
            "taints": {
                "type": ["array", "null"],
                "maxItems": 16,
                "items": {"type": "string", "pattern": TAINT_PATTERN.pattern},
                "description": "Taints beside the agent's: key=value or key.",
            },
        },
    }
    done = {"type": "object", "properties": {"node": _ref("Node"), "seq": {"type": "integer"}}}
    return {
        "/v1/nodes/{node_id}/rules": {
            "parameters": [_NODE_ID],
            "put": {
                "operationId": "setNodeRules",
                "summary": "Set the operator's labels and taints of a node, replacing the previous set "
                "(admin only); running jobs stay",
                "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                "responses": {
                    "200": _json("NodeRulesSet appended; the node as this API's fold now shows it.", done),
                    "400": _problem("Body is not JSON."),
                    "403": _problem("The token is not an admin's."),
                    "404": _problem("Unknown node."),
                    "422": _problem("A bad label or taint (`field` names it)."),
                    "503": _problem("The event log did not acknowledge, or the node's state kept changing."),
                },
            },
        }
    }


_REPLAYED = {
    "Idempotent-Replayed": {
        "description": "`true` when the job already existed (a retry).",
        "schema": {"type": "string", "enum": ["true"]},
    }
}


def openapi_document(
    priority_classes: Sequence[str] = PRIORITY_CLASSES,
    default_priority: str = DEFAULT_PRIORITY,
    checkpoint_root: str | None = None,
) -> dict[str, Any]:
    """The document; ``priority_classes`` and ``default_priority`` are the cluster's (its queue file's),
    so a client generated from it accepts the classes this API accepts; ``checkpoint_root`` the API's
    (where a job's own ``checkpoint_dir`` may lie; None: nowhere)."""
    job_spec = _job_spec_schema(priority_classes, default_priority, checkpoint_root)
    return with_security(_with_clean_parameters(_document(job_spec)))


def _with_clean_parameters(document: dict[str, Any]) -> dict[str, Any]:
    """Every string query and path parameter states the text rule, and every operation that takes one
    its 400 (the server's ``clean_input_middleware`` refuses the rest). Applied to the whole document, so
    a parameter added later states it without anyone remembering to."""
    for operations in document["paths"].values():
        shared = [_clean_parameter(p) for p in operations.get("parameters", [])]
        if shared:
            operations["parameters"] = shared
        for method, operation in operations.items():
            if method == "parameters":
                continue
            own = [_clean_parameter(p) for p in operation.get("parameters", [])]
            if own:
                operation["parameters"] = own
            if any(_is_text(p) for p in shared + own):
                operation.setdefault("responses", {}).setdefault("400", _problem(_UNCLEAN_PARAMETER))
    return document


_UNCLEAN_PARAMETER = (
    "A query or path parameter is not clean text: a control character, invalid UTF-8 or a bidirectional "
    "formatting character (`field` names it), or a parameter this operation reads is malformed."
)


def _is_text(parameter: dict[str, Any]) -> bool:
    return parameter.get("in") in ("query", "path") and parameter.get("schema", {}).get("type") == "string"


def _clean_parameter(parameter: dict[str, Any]) -> dict[str, Any]:
    """The parameter with the text rule's pattern, unless it is no string or its enum or pattern is
    narrower already (a copy: the parameters are shared by the operations that take them)."""
    schema = parameter.get("schema", {})
    if not _is_text(parameter) or "enum" in schema or "pattern" in schema:
        return parameter
    return {**parameter, "schema": {**schema, "pattern": CLEAN_TEXT_PATTERN}}


def _job_spec_schema(classes: Sequence[str], default: str, checkpoint_root: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = _SCHEMAS["JobSpec"]
    properties = {
        **spec["properties"],
        "priority": _priority_schema(classes, default),
        "checkpoint_dir": _checkpoint_dir_schema(checkpoint_root),
    }
    return {**spec, "properties": properties}


def _document(job_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Rallypoint API",
            "version": "1",
            "description": "Submit and inspect gang-scheduled training jobs. Writes are appended to the "
            "event log and answered once acknowledged; reads come from this instance's fold "
            "of the log.",
        },
        "paths": {
            "/v1/jobs": {
                "post": {
                    "operationId": "submitJob",
                    "summary": "Submit a job (idempotent with Idempotency-Key or a CloudEvent id)",
                    "parameters": [
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
                        },
                        dry_run_parameter(),
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": _ref("JobSpec")},
                            "application/cloudevents+json": {"schema": _ref("CloudEvent")},
                        },
                    },
                    "responses": {
                        "200": dry_run_ok(),
                        "202": {
                            **_json(
                                "Appended to the log (or already there: see Idempotent-Replayed).",
                                _ref("Accepted"),
                                _REPLAYED,
                            ),
                            "links": _JOB_LINKS,
                        },
                        "400": _problem(
                            f"Body is not JSON, repeats a key, or nests over {MAX_JSON_DEPTH} levels; or "
                            "dry_run is not true or false."
                        ),
                        "413": _problem("The body is over 1 MiB."),
                        "415": _problem(
                            "The body is not labelled application/json or application/cloudevents+json "
                            "(a form or text body), or is a CloudEvents batch."
                        ),
                        "403": _problem(
                            "A team token submitting for another team, or at a priority class the queue file "
                            "does not grant its team (field: team or priority)."
                        ),
                        "422": _problem(
                            "Invalid spec, larger than the cluster, or a reused key with "
                            "another spec; nothing was appended."
                        ),
                        "409": _problem(
                            "The Idempotency-Key was used with other secret values (field: secrets); "
                            "nothing was appended."
                        ),
                        "429": _FAIR_USE_LIMIT,
                        "503": _problem(
                            "The event log or the secrets store did not acknowledge, or this instance "
                            "cannot see the appended job yet; retry with the same key."
                        ),
                    },
                },
                "get": _fold_read(
                    {
                        "operationId": "listJobs",
                        "summary": "List jobs in submission order",
                        "parameters": [
                            {
                                "name": "state",
                                "in": "query",
                                "schema": comma_list(_JOB_STATES),
                                "description": "Comma-separated states, e.g. `pending,running`.",
                            },
                            {"name": "team", "in": "query", "schema": {"type": "string"}},
                            {
                                "name": "array",
                                "in": "query",
                                "schema": {"type": "string"},
                                "description": "Only the members of this array (its array_id).",
                            },
                            {
                                "name": "limit",
                                "in": "query",
                                "schema": {
                                    "type": "integer",
                                    "minimum": 1,
                                    "maximum": 10000,
                                    "default": 1000,
                                },
                            },
                            {
                                "name": "after",
                                "in": "query",
                                "schema": {"type": "integer", "default": 0},
                                "description": "Only jobs submitted after this stream sequence "
                                "(paging cursor).",
                            },
                        ],
                        "responses": {"200": _json("Jobs.", _ref("JobList")), "400": _problem("Bad query.")},
                    }
                ),
            },
            "/v1/jobs/{job_id}": {
                "parameters": [_JOB_ID],
                "get": _fold_read(
                    {
                        "operationId": "getJob",
                        "summary": "One job: state, pending reason, queue position, allocation",
                        "responses": {"200": _json("The job.", _ref("Job")), "404": _problem("Unknown job.")},
                    }
                ),
                "delete": {
                    "operationId": "cancelJob",
                    "summary": "Request cancellation (the job controller stops it)",
                    "responses": {
                        "202": _json("JobCancelRequested appended.", _ref("CancelAccepted")),
                        "404": _problem("Unknown job."),
                        "409": _problem("The job already finished."),
                        "503": _problem("The event log did not acknowledge."),
                    },
                },
            },
            **{
                f"/v1/jobs/{{job_id}}/{action}": {
                    "parameters": [_JOB_ID],
                    "post": {
                        "operationId": f"{action}Job",
                        "summary": summary,
                        "responses": {
                            "202": _json(f"{event} appended.", _ref("SuspendAccepted")),
                            "404": _problem("Unknown job."),
                            "409": _problem(conflict),
                            "503": _problem("The event log did not acknowledge."),
                        },
                    },
                }
                for action, event, summary, conflict in (
                    (
                        "suspend",
                        "JobSuspendRequested",
                        "Suspend: checkpoint, stop every rank, free the GPUs until a resume",
                        "The job finished, is suspended or is being suspended.",
                    ),
                    (
                        "resume",
                        "JobResumed",
                        "Resume a suspended job in its original place (or withdraw a pending suspend)",
                        "The job finished, or is neither suspended nor being suspended.",
                    ),
                )
            },
            "/v1/jobs/{job_id}/checkpoints": {
                "parameters": [_JOB_ID],
                "get": _fold_read(
                    {
                        "operationId": "listJobCheckpoints",
                        "summary": "A job's checkpoints and the latest complete one",
                        "responses": {
                            "200": _json("The checkpoints, oldest step first.", _ref("CheckpointList")),
                            "404": _problem("Unknown job."),
                        },
                    }
                ),
            },
            "/v1/nodes": {
                "get": _fold_read(
                    {
                        "operationId": "listNodes",
                        "summary": "Registered nodes",
                        "responses": {"200": _json("Nodes.", _ref("NodeList"))},
                    }
                )
            },
            **_node_action_paths(),
            **_node_rules_path(),
            "/v1/state": {
                "get": _fold_read(
                    {
                        "operationId": "getState",
                        "summary": "Fold position and state hash",
                        "responses": {"200": _json("Position and hash.", _ref("State"))},
                    }
                )
            },
            "/v1/openapi.json": {
                "get": {
                    "operationId": "getOpenApi",
                    "summary": "This document",
                    "responses": {"200": {"description": "OpenAPI 3.1 document."}},
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "health",
                    "summary": "200 once the log is replayed",
                    "responses": {
                        "200": {
                            "description": "Serving: `status` ok, or degraded (with `degraded` reasons) when "
                            "the log holds newer event versions than this instance reads."
                        },
                        "503": {"description": "Still replaying, or not following."},
                    },
                }
            },
            **history_paths(),
            **why_paths(),
            **predictions_paths(),
            **terminal_paths(),
            **dashboard_paths(),
            "/metrics": {
                "get": {
                    "operationId": "metrics",
                    "summary": "Prometheus metrics",
                    "responses": {
                        "200": {
                            "description": "Text exposition format.",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
        "components": {
            "schemas": {
                **_SCHEMAS,
                "JobSpec": job_spec,
                **history_schemas(),
                **why_schemas(),
                **predictions_schemas(),
                **dry_run_schemas(),
            }
        },
    }
