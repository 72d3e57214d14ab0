"""A small synchronous client of the Rallypoint HTTP API, for the `rally` commands.

Synchronous urllib on purpose: a command makes a handful of requests and exits, so an event loop and
a session would only add start-up time and code. Errors become two exception types a command can turn
into one line on stderr: ``ApiError`` (the API answered with a problem) and ``ApiUnreachable``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_API_URL = "http://127.0.0.1:8080"
API_URL_ENV = "RALLY_API_URL"
TOKEN_ENV = "RALLY_TOKEN"
CLUSTER_FILE = Path(".rally") / "cluster.json"  # written by `rally up` in the directory it runs in
TOKENS_FILE = Path(".rally") / "tokens.json"  # the local cluster's tokens, also written by `rally up`
DEFAULT_TIMEOUT_S = 10.0


def resolve_api_url(
    explicit: str | None = None, *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> str:
    """--api-url, else $RALLY_API_URL, else ./.rally/cluster.json's "api_url", else the default."""
    if explicit:
        return explicit.rstrip("/")
    environ = os.environ if env is None else env
    if environ.get(API_URL_ENV):
        return environ[API_URL_ENV].rstrip("/")
    cluster_file = (cwd or Path.cwd()) / CLUSTER_FILE
    try:
        url = json.loads(cluster_file.read_text()).get("api_url")
    except (OSError, ValueError, AttributeError):
        # No local cluster here (or a half-written file from a crashed `rally up`): use the default.
        url = None
    if isinstance(url, str) and url:
        return url.rstrip("/")
    return DEFAULT_API_URL


def resolve_token(*, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> str | None:
    """$RALLY_TOKEN, else the admin token of the local cluster started in this folder, else none.

    No ``--token`` flag on purpose: a flag lands in shell history and in ``ps`` for every user to read.
    """
    environ = os.environ if env is None else env
    if environ.get(TOKEN_ENV):
        return environ[TOKEN_ENV].strip()
    try:
        admin = json.loads(((cwd or Path.cwd()) / TOKENS_FILE).read_text()).get("admin")
    except (OSError, ValueError, AttributeError):
        return None
    return admin if isinstance(admin, str) and admin else None


class ApiError(Exception):
    """The API answered with an error status; ``problem`` is its problem+json body (or a stand-in)."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        super().__init__(self.line())

    @property
    def field(self) -> str | None:
        field = self.problem.get("field")
        return field if isinstance(field, str) else None

    @property
    def detail(self) -> str:
        detail = self.problem.get("detail") or self.problem.get("title") or f"HTTP {self.status}"
        return str(detail)

    def line(self) -> str:
        """The one line a command prints: ``error: <field>: <detail>``."""
        return f"error: {self.field}: {self.detail}" if self.field else f"error: {self.detail}"


class ApiUnreachable(Exception):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(self.line())

    def line(self) -> str:
        return (
            f"error: cannot reach the Rallypoint API at {self.url} ({self.reason}). Is it running? "
            f"Start a local cluster with `rally up`, or point at one with --api-url or ${API_URL_ENV}."
        )


class Response:
    def __init__(self, status: int, body: Any, headers: Mapping[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = {k.lower(): v for k, v in headers.items()}


class ApiClient:
    def __init__(
        self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT_S, token: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # Resolved here, so every command (present and future) authenticates the same way.
        self.token = token if token is not None else resolve_token()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str | int | None] | None = None,
    ) -> Response:
        url = self.base_url + path
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json, application/problem+json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return Response(resp.status, _decode(resp.read()), dict(resp.headers.items()))
        except urllib.error.HTTPError as err:
            raw = err.read()
            payload = _decode(raw)
            text = raw.decode(errors="replace").strip() or f"HTTP {err.code} {err.reason}"
            problem = payload if isinstance(payload, dict) else {"detail": text}
            raise ApiError(err.code, problem) from None
        except urllib.error.URLError as err:
            reason = err.reason
            text = "connection refused" if isinstance(reason, ConnectionRefusedError) else str(reason)
            raise ApiUnreachable(self.base_url, text) from None
        except (TimeoutError, ConnectionError) as err:
            raise ApiUnreachable(self.base_url, f"{type(err).__name__}: {err}") from None

    # -- the API's operations --------------------------------------------------------------------

    def submit(self, spec: Mapping[str, Any], *, idempotency_key: str | None = None) -> Response:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return self.request("POST", "/v1/jobs", body=dict(spec), headers=headers)

    def get_job(self, job_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self.request("GET", f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}").body
        return body

    def list_jobs(
        self,
        *,
        state: str | None = None,
        team: str | None = None,
        limit: int | None = None,
        stale: bool = False,
    ) -> dict[str, Any]:
        """One JobList (the API's shape) of the jobs in submission order, following the API's pages up
        to ``limit`` (all when None): every job, and the last page's ``next_after`` and ``seq``.
        ``stale``: the API's last known view, without asking the event log (docs/api.md)."""
        jobs: list[dict[str, Any]] = []
        after: int | None = None
        while True:
            page_limit = None if limit is None else min(limit - len(jobs), 10_000)
            params = {
                "state": state,
                "team": team,
                "limit": page_limit,
                "after": after,
                **stale_params(stale),
            }
            body = self.request("GET", "/v1/jobs", params=params).body
            jobs.extend(body["jobs"])
            after = body.get("next_after")
            if after is None or (limit is not None and len(jobs) >= limit):
                return {**body, "jobs": jobs, "count": len(jobs)}

    def list_nodes(self, *, stale: bool = False) -> dict[str, Any]:
        """The API's NodeList, as it answers (``stale``: as ``list_jobs``)."""
        body: dict[str, Any] = self.request("GET", "/v1/nodes", params=stale_params(stale)).body
        return body

    def cancel(self, job_id: str) -> dict[str, Any]:
        body: dict[str, Any] = self.request("DELETE", f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}").body
        return body

    def suspend_or_resume(self, job_id: str, action: str) -> dict[str, Any]:
        """POST /v1/jobs/{id}/suspend or /resume."""
        path = f"/v1/jobs/{urllib.parse.quote(job_id, safe='')}/{action}"
        body: dict[str, Any] = self.request("POST", path).body
        return body


def stale_params(stale: bool) -> dict[str, str]:
    """The query parameters of a stale read (docs/api.md, "Reading what was written"); none without one."""
    return {"stale": "true"} if stale else {}


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None
