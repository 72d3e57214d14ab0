"""Who is calling: bearer-token authentication and the team checks every handler shares.

Every route needs ``Authorization: Bearer <token>`` except the few a load balancer, Prometheus or a
client generator must reach without one (``PUBLIC_PATHS``): they carry no job data. The caller becomes a
:class:`Principal` stored on the request; handlers ask :func:`principal` who it is and decide with
``may_act_for``. Without a token store (``build_app(auth=None)``, in-process tests and embedding only)
every caller is an anonymous admin; ``rally serve api`` always has one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from rallypoint.security.tokens import ANONYMOUS_ADMIN, Principal, TokenStore
from rallypoint.state import JobView

from .problems import not_found, problem

PUBLIC_PATHS: frozenset[str] = frozenset({"/healthz", "/readyz", "/metrics", "/v1/openapi.json", "/"})
#: The dashboard's static files (``dashboard.py``): no data in them; the page reads the API with a token.
PUBLIC_PREFIXES: tuple[str, ...] = ("/dashboard/",)
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)
_CHALLENGE = 'Bearer realm="rallypoint"'

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def unauthorized(detail: str, *, invalid: bool) -> web.Response:
    # RFC 6750: error="invalid_token" when a token was sent but is not good; a bare challenge otherwise.
    challenge = _CHALLENGE + (', error="invalid_token"' if invalid else "")
    return problem(401, "Unauthorized", detail, slug="unauthorized", headers={"WWW-Authenticate": challenge})


def forbidden(detail: str, *, field: str | None = None) -> web.Response:
    return problem(403, "Forbidden", detail, slug="forbidden", field=field)


def principal(request: web.Request) -> Principal:
    """The authenticated caller (an anonymous admin when the app runs without a token store)."""
    return request.get(PRINCIPAL, ANONYMOUS_ADMIN)


def not_theirs(request: web.Request, job: JobView) -> web.Response | None:
    """404 when the caller's token may not act for the job's team (None: it may).

    The very 404 of a job that does not exist, not a 403: a team token learns nothing of another team's
    jobs, not even that an id it guessed or read somewhere is one (docs/api.md, "What a team sees").
    """
    if principal(request).may_act_for(job.spec.team):
        return None
    return not_found("job", job.job_id)


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def auth_middleware(store: TokenStore) -> Middleware:
    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS or request.path.startswith(PUBLIC_PREFIXES):
            return await handler(request)
        header = request.headers.get("Authorization")
        token = bearer_token(header)
        if token is None:
            detail = (
                "send Authorization: Bearer <token>"
                if header is None
                else "the Authorization header is not 'Bearer <token>'"
            )
            return unauthorized(detail, invalid=header is not None)
        who = store.authenticate(token)
        if who is None:
            return unauthorized("the token is unknown or revoked", invalid=True)
        request[PRINCIPAL] = who
        return await handler(request)

    return authenticate


def with_security(document: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with the bearer scheme, required everywhere but ``PUBLIC_PATHS``.

    Applied to the whole document rather than written per operation, so a route added later is
    documented as authenticated (with its 401 and 403) without anyone remembering to.
    """
    components = document.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "An API token (`rally tokens create`), bound to one team or to the admin role.",
    }
    document["security"] = [{"bearer": []}]
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            if method == "parameters":
                continue
            if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
                operation["security"] = []
                continue
            responses = operation.setdefault("responses", {})
            responses.setdefault("401", _problem_response(_UNAUTHORIZED))
            responses.setdefault("403", _problem_response(_FORBIDDEN))
    return document


_UNAUTHORIZED = "No token, or an unknown or revoked one (with `WWW-Authenticate: Bearer`)."
_FORBIDDEN = (
    "The token's team may not do this: another team in the body or the query, an admin's operation, or a "
    "priority class above the team's `max_priority`. Another team's job is a 404, as a missing one."
)


def _problem_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
