"""Input limits: every number and size a submission carries is bounded, and a refusal names the field.

The bodies the issue measured on the live cluster (time_limit_s 2^63, a 200,000-element command, a
900 KB env value, JSON 3,000 levels deep) and one just past each limit; the limit itself is accepted.
The same numbers are in docs/api.md ("Limits") and the OpenAPI schema, which a test here checks.
"""

from __future__ import annotations

from typing import Any

import pytest
from rallypoint_services.api.openapi import openapi_document

from rallypoint.jobs import SpecError, validate_spec
from rallypoint.jobs import validate as limits
from rallypoint.jobs.validate import check_json_depth, json_depth


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "pretrain", "team": "nlp", "gpus": 16, "command": ["python", "train.py"]}
    base.update(overrides)
    return base


def many_env(count: int, size: int = 1) -> dict[str, str]:
    return {f"V{i}": "x" * size for i in range(count)}


# (case, body, the field the 422 must name, a fragment of its detail)
REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("time limit 2^63", body(time_limit_s=2**63), "time_limit_s", f"<= {limits.MAX_TIME_LIMIT_S}"),
    (
        "time limit a year and a second",
        body(time_limit_s=limits.MAX_TIME_LIMIT_S + 1),
        "time_limit_s",
        "one year",
    ),
    ("gpus 2^63", body(gpus=2**63), "gpus", f"<= {limits.MAX_GPUS}"),
    ("gpus just past the limit", body(gpus=limits.MAX_GPUS + 1), "gpus", f"<= {limits.MAX_GPUS}"),
    ("gpus per task huge", body(gpus_per_task=2**70), "gpus_per_task", f"<= {limits.MAX_GPUS}"),
    ("ranks per task huge", body(ranks_per_task=2**63), "ranks_per_task", f"<= {limits.MAX_GPUS}"),
    ("min gpus huge", body(min_gpus=2**63), "min_gpus", f"<= {limits.MAX_GPUS}"),
    ("max gpus huge", body(max_gpus=2**63), "max_gpus", f"<= {limits.MAX_GPUS}"),
    ("gpu step huge", body(min_gpus=8, gpu_step=2**63), "gpu_step", f"<= {limits.MAX_GPUS}"),
    (
        "command of 200,000 elements",
        body(command=["x"] * 200_000),
        "command",
        f"at most {limits.MAX_COMMAND_ITEMS}",
    ),
    (
        "command one element too many",
        body(command=["x"] * (limits.MAX_COMMAND_ITEMS + 1)),
        "command",
        "elements",
    ),
    ("command element of 900 KB", body(command=["python", "x" * 900_000]), "command", "element 1"),
    (
        "command element one byte over",
        body(command=["python", "é" * (limits.MAX_ARG_BYTES // 2) + "x"]),
        "command",
        "bytes",
    ),
    (
        "command too large in all",
        body(command=["python"] + ["x" * 30_000] * 9),
        "command",
        f"at most {limits.MAX_COMMAND_BYTES}",
    ),
    ("command with NUL", body(command=["python", "a\x00b"]), "command[1]", "NUL"),
    ("env value of 900 KB", body(env={"BIG": "x" * 900_000}), "env", "value of BIG"),
    (
        "env too many variables",
        body(env=many_env(limits.MAX_ENV_VARS + 1)),
        "env",
        f"at most {limits.MAX_ENV_VARS}",
    ),
    ("env too large in all", body(env=many_env(9, 30_000)), "env", f"at most {limits.MAX_ENV_BYTES}"),
    (
        "env name too long",
        body(env={"A" * (limits.MAX_ENV_NAME_LENGTH + 1): "x"}),
        "env",
        "not a valid environment",
    ),
    ("env value with NUL", body(env={"A": "\x00"}), "env.A", "NUL"),
    (
        "gpu type too long",
        body(gpu_type="h" * (limits.MAX_TEXT_LENGTH + 1)),
        "gpu_type",
        f"at most {limits.MAX_TEXT_LENGTH}",
    ),
    ("gpu types item too long", body(gpu_types=["h" * (limits.MAX_TEXT_LENGTH + 1)]), "gpu_types", "item 0"),
    (
        "checkpoint dir too long",
        body(checkpoint_dir="/" * (limits.MAX_TEXT_LENGTH + 1)),
        "checkpoint_dir",
        "at most",
    ),
]


@pytest.mark.parametrize(("case", "given", "field", "fragment"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_naming_the_field(case: str, given: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate_spec(given)
    assert caught.value.field == field
    assert fragment in caught.value.detail
    assert len(caught.value.detail) < 400  # a refusal never echoes the oversized value back


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("time limit of one year", body(time_limit_s=limits.MAX_TIME_LIMIT_S)),
    ("command at its element limit", body(command=["x"] * limits.MAX_COMMAND_ITEMS)),
    ("command element at its byte limit", body(command=["python", "x" * limits.MAX_ARG_BYTES])),
    ("env at its variable limit", body(env=many_env(limits.MAX_ENV_VARS))),
    ("env value at its byte limit", body(env={"BIG": "x" * limits.MAX_ARG_BYTES})),
    ("env name at its limit", body(env={"A" * limits.MAX_ENV_NAME_LENGTH: "x"})),
    ("gpu type at its limit", body(gpu_type="h" * limits.MAX_TEXT_LENGTH)),
]


@pytest.mark.parametrize(("case", "given"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_the_limit_itself_is_accepted(case: str, given: dict[str, Any]) -> None:
    validate_spec(given)


# --- nesting depth, checked before any decoder recurses ----------------------------------------------


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    ("raw", "depth"),
    [
        (b"", 0),
        (b"17", 0),
        (b'{"a": 1}', 1),
        (b'{"command": ["python"], "env": {"A": "x"}}', 2),
        (b'{"a": "[[[{{{"}', 1),  # brackets inside strings do not count
        (b'{"a": "quote \\" then [[[", "b": [1]}', 2),  # nor after an escaped quote
        (b'{"a": "backslash \\\\", "b": [[1]]}', 3),
        (nested(3000), 3000),
    ],
)
def test_json_depth(raw: bytes, depth: int) -> None:
    assert json_depth(raw) == depth


def test_3000_levels_are_refused_as_the_body() -> None:
    with pytest.raises(SpecError) as caught:
        check_json_depth(nested(3000))
    assert caught.value.field == "body" and f"at most {limits.MAX_JSON_DEPTH}" in caught.value.detail


def test_the_depth_limit_itself_passes() -> None:
    check_json_depth(nested(limits.MAX_JSON_DEPTH))
    with pytest.raises(SpecError):
        check_json_depth(nested(limits.MAX_JSON_DEPTH + 1))


# --- the OpenAPI schema states the same limits ---------------------------------------------------------


def test_the_openapi_schema_states_the_limits() -> None:
    spec = openapi_document(checkpoint_root="/ckpt")["components"]["schemas"]["JobSpec"]["properties"]
    assert spec["time_limit_s"]["maximum"] == limits.MAX_TIME_LIMIT_S
    for field in ("gpus", "gpus_per_task", "ranks_per_task", "min_gpus", "max_gpus", "gpu_step"):
        assert spec[field]["maximum"] == limits.MAX_GPUS, field
    assert spec["command"]["maxItems"] == limits.MAX_COMMAND_ITEMS
    assert spec["command"]["items"]["maxLength"] == limits.MAX_ARG_BYTES
    assert spec["env"]["maxProperties"] == limits.MAX_ENV_VARS
    assert spec["env"]["additionalProperties"]["maxLength"] == limits.MAX_ARG_BYTES
    assert spec["env"]["propertyNames"]["maxLength"] == limits.MAX_ENV_NAME_LENGTH
    for field in ("gpu_type", "checkpoint_dir"):
        assert spec[field]["maxLength"] == limits.MAX_TEXT_LENGTH, field
