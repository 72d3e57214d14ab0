"""Job arrays (issue 35, Build item 2): ``--array 0-99%8`` is 100 jobs of one spec, each knowing its index,
at most 8 of them holding GPUs at once.

The expression is Slurm's: comma-separated indices and ranges (``0-99``, ``1,3,10-20``, ``0-30:10`` for a
step), then optionally ``%N``, the most members that may hold GPUs at once. The API expands an array into
one job per index, ``<array id>_<index>``, appended all or nothing, each spec carrying ``ArrayMember``; the
fold then holds the members past the limit (``state.dependencies``) and each rank gets ``RALLY_ARRAY_ID``,
``RALLY_ARRAY_INDEX`` and ``RALLY_ARRAY_COUNT``.
"""

from __future__ import annotations

import re

import msgspec

from rallypoint.events import ArrayMember, JobSpec

from .validate import SpecError

__all__ = [
    "ARRAY_PATTERN",
    "MAX_ARRAY_INDEX",
    "MAX_ARRAY_SIZE",
    "ArrayRequest",
    "array_env",
    "member_id",
    "members",
    "parse_array",
]

#: The most members one array may have (Slurm's default MaxArraySize is 1001).
MAX_ARRAY_SIZE = 1000
MAX_ARRAY_INDEX = 1_000_000
MAX_ARRAY_TEXT = 4096
_PART = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
#: the whole expression, ASCII digits only (the OpenAPI document's pattern, services/api/openapi.py)
ARRAY_PATTERN = r"^[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[0-9]+)?$"


class ArrayRequest(msgspec.Struct, frozen=True):
    """An array expression, parsed: its indices in increasing order and its limit (None: none)."""

    indices: tuple[int, ...]
    max_running: int | None


def parse_array(text: object) -> ArrayRequest:
    """The indices and limit of ``text`` (``0-99%8``), or ``SpecError`` naming ``array``."""
    if not isinstance(text, str) or not text:
        raise SpecError("array", f"must be an index expression such as '0-99%8', got {text!r}")
    if len(text) > MAX_ARRAY_TEXT:
        raise SpecError("array", f"at most {MAX_ARRAY_TEXT} characters, got {len(text)}")
    spec, _, limit = text.partition("%")
    indices: set[int] = set()
    for part in spec.split(","):
        indices.update(_part(part, text))
        if len(indices) > MAX_ARRAY_SIZE:
            raise SpecError("array", f"at most {MAX_ARRAY_SIZE} members, got more in {text!r}")
    max_running = None
    if limit:
        if not re.fullmatch(r"[0-9]+", limit) or int(limit) < 1:
            raise SpecError("array", f"the limit after '%' must be a whole number >= 1, got {limit!r}")
        max_running = int(limit)
    return ArrayRequest(tuple(sorted(indices)), max_running)


def _part(part: str, text: str) -> range:
    m = _PART.fullmatch(part)
    if m is None:
        raise SpecError(
            "array", f"{part!r} in {text!r} is not an index, a range A-B or a stepped range A-B:S"
        )
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    step = int(m.group(3)) if m.group(3) is not None else 1
    if last < first or step < 1 or last > MAX_ARRAY_INDEX:
        raise SpecError("array", f"{part!r} in {text!r}: need A <= B <= {MAX_ARRAY_INDEX} and a step >= 1")
    if (last - first) // step + 1 > MAX_ARRAY_SIZE:
        raise SpecError("array", f"at most {MAX_ARRAY_SIZE} members, got more in {text!r}")
    return range(first, last + 1, step)


def member_id(array_id: str, index: int) -> str:
    """The job id of the array's member ``index``."""
    return f"{array_id}_{index}"


def members(array_id: str, spec: JobSpec, request: ArrayRequest) -> list[tuple[str, JobSpec]]:
    """Each member's job id and spec, in index order."""
    count = len(request.indices)
    return [
        (
            member_id(array_id, i),
            msgspec.structs.replace(
                spec,
                array=ArrayMember(array_id=array_id, index=i, count=count, max_running=request.max_running),
            ),
        )
        for i in request.indices
    ]


def array_env(spec: JobSpec) -> dict[str, str]:
    """What a member's ranks are told of their array (nothing for a job that is not a member)."""
    if spec.array is None:
        return {}
    a = spec.array
    return {
        "RALLY_ARRAY_ID": a.array_id,
        "RALLY_ARRAY_INDEX": str(a.index),
        "RALLY_ARRAY_COUNT": str(a.count),
    }
