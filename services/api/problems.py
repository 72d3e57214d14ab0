"""RFC 9457 problem details: every error the API returns has this shape, so clients parse one thing.

Validation problems also carry ``field`` (the one offending field, what the CLI prints) and
``invalid_params`` (RFC 9457's example extension, what generic clients look for).
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from rallypoint.jobs import SpecError

PROBLEM_JSON = "application/problem+json"
PROBLEM_BASE = "https://rallypoint.dev/problems/"

_encoder = msgspec.json.Encoder()


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    slug: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> web.Response:
    body: dict[str, Any] = {"type": PROBLEM_BASE + slug, "title": title, "status": status, "detail": detail}
    if field is not None:
        body["field"] = field
        body["invalid_params"] = [{"name": field, "reason": detail}]
    body.update(extra)
    return web.Response(status=status, body=_encoder.encode(body), content_type=PROBLEM_JSON, headers=headers)


def invalid_spec(err: SpecError, *, status: int = 422) -> web.Response:
    return problem(status, "Invalid job specification", err.detail, slug="invalid-job-spec", field=err.field)


def unparseable(detail: str, *, field: str = "body") -> web.Response:
    """400: the body cannot be read; ``field`` is the string in it that is not UTF-8, when one is."""
    return problem(400, "Malformed request body", detail, slug="malformed-body", field=field)


def not_found(what: str, ident: str) -> web.Response:
    return problem(404, f"No such {what}", f"{what} {ident!r} does not exist", slug="not-found")


def unavailable(detail: str) -> web.Response:
    # Retry-After: the log is usually back within seconds (a server restart or a leader change).
    return problem(503, "Event log unavailable", detail, slug="log-unavailable", headers={"Retry-After": "2"})
