"""The few JSON-over-HTTP calls the demo, the benchmarks and the tests make to the API (stdlib only).

Every API call needs a bearer token. A ``LocalCluster`` registers its admin token for its API's address
when it starts (``register_token``), so a call to that address made without a token of its own goes as
the cluster's admin: the harnesses that drive a cluster they started need no token plumbing. A caller
that wants another identity passes ``token=`` (``LocalCluster.token_for(team)``) or its own
``Authorization`` header; ``token=""`` sends none.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

_DEFAULT_TOKENS: dict[str, str] = {}  # "http://host:port" -> the admin token of the cluster serving it


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def register_token(api_url: str, token: str | None) -> None:
    """Calls to ``api_url`` without a token use ``token`` (None: forget it, when the cluster stops)."""
    if token is None:
        _DEFAULT_TOKENS.pop(_origin(api_url), None)
    else:
        _DEFAULT_TOKENS[_origin(api_url)] = token


def auth_headers(url: str, token: str | None = None) -> dict[str, str]:
    """The Authorization header for a call to ``url``: ``token``, else the registered one, else none."""
    chosen = _DEFAULT_TOKENS.get(_origin(url)) if token is None else token
    return {"Authorization": f"Bearer {chosen}"} if chosen else {}


def call(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
    *,
    token: str | None = None,
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    for key, value in {**auth_headers(url, token), **(headers or {})}.items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        payload = error.read()
        try:
            return error.code, json.loads(payload)
        except ValueError:
            return error.code, payload.decode(errors="replace")
