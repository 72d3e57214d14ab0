"""How a read of the fold is answered: the wait before it (``FoldFollower.wait_current``) and the 503 each
way it can fail ends in, the ``?stale`` opt-in that skips that wait, and the headers saying where the
answer stands (docs/api.md, "Reading what was written").

The read routes are wrapped here (``FoldReads``), not checked in each handler, so every one of them
parses ``stale`` the same way and carries the same headers.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from rallypoint.eventlog import LogUnavailable

from .fold import FoldFollower, NotVisible, Replaying
from .problems import problem, unavailable

STALE_PARAM = "stale"
#: The fold's position (stream sequence) the answer was computed at.
SEQ_HEADER = "Rally-Log-Seq"
#: How the read was served: ``linearizable`` (waited for every acknowledged write) or ``stale``.
READ_HEADER = "Rally-Read"
LINEARIZABLE = "linearizable"
STALE = "stale"
# ``?stale`` alone reads as an empty value: asking for it is saying yes.
_YES = frozenset({"", "true", "1"})
_NO = frozenset({"false", "0"})

Handler = Callable[[web.Request], Awaitable[web.Response]]


def stale_asked(request: web.Request) -> bool | None:
    """Whether the request asks for a stale read; None when ``stale`` holds a value this API does not read."""
    raw = request.query.get(STALE_PARAM)
    if raw is None:
        return False
    value = raw.lower()
    return True if value in _YES else False if value in _NO else None


def _invalid_stale(detail: str) -> web.Response:
    return problem(400, "Invalid query parameter", detail, slug="invalid-query", field=STALE_PARAM)


def _unreadable_stale(request: web.Request) -> web.Response:
    got = request.query[STALE_PARAM]
    return _invalid_stale(f"stale must be true, 1, false or 0 (or given without a value), got {got!r}")


async def ready_to_read(
    follower: FoldFollower, timeout: float, *, stale_hint: bool = False
) -> web.Response | None:
    """None once the fold holds every write acknowledged before the read began; else the 503 to answer.
    ``stale_hint``: the request could be asked again with ``?stale=true`` (its 503 says so)."""
    try:
        await follower.wait_current(timeout)
    except Replaying:
        return unavailable("the API is still replaying the event log; retry shortly")
    except LogUnavailable as exc:
        # Without the log's answer this instance cannot know what it has not seen yet: a 200 from its
        # fold could be a 404 for a job another replica accepted. Only the client may accept that.
        hint = (
            f", or add ?stale=true for this API's last known view (log position {follower.state.last_seq})"
            if stale_hint
            else ""
        )
        return unavailable(f"the event log did not say where it ends ({exc}); retry shortly{hint}")
    except NotVisible as exc:
        return problem(
            503,
            "Not visible yet",
            f"this API's view of the log (seq {exc.at}) has not reached the writes acknowledged before "
            f"this request (seq {exc.target}) yet; retry shortly",
            slug="not-visible",
            headers={"Retry-After": "2"},
        )
    return None


def stale_ready(follower: FoldFollower) -> web.Response | None:
    """None when a stale read may be answered: at once, from whatever the fold holds, but never from a
    half-replayed fold (that is not an old view of the cluster, it is a wrong one)."""
    if follower.caught_up.is_set():
        return None
    return unavailable(
        "the API is still replaying the event log (a stale read waits for that too); retry shortly"
    )


class FoldReads:
    """Wraps a handler that answers from the fold: it runs once the read may be answered, linearizable
    (the default) or stale (``?stale=true``), and its answer carries ``SEQ_HEADER`` and ``READ_HEADER``."""

    def __init__(self, follower: FoldFollower, timeout: float) -> None:
        self.follower = follower
        self.timeout = timeout

    def __call__(self, handler: Handler, *, reads_log: bool = False) -> Handler:
        """``reads_log``: the handler also reads the log itself (a job's history, its rank logs), which an
        outage makes fail anyway, so a stale read is refused there (400) rather than half answered."""

        @functools.wraps(handler)
        async def read(request: web.Request) -> web.Response:
            stale = _stale_or_refusal(request, offered=not reads_log)
            if isinstance(stale, web.Response):
                return stale
            waited = (
                stale_ready(self.follower)
                if stale
                else await ready_to_read(self.follower, self.timeout, stale_hint=not reads_log)
            )
            if waited is not None:
                return waited
            # Taken before the handler runs: a handler over the fold alone does not await, so this is the
            # position its answer was computed at (one that reads the log too covers at least this much).
            seq = self.follower.state.last_seq
            response = await handler(request)
            response.headers[SEQ_HEADER] = str(seq)
            response.headers[READ_HEADER] = STALE if stale else LINEARIZABLE
            return response

        return read


def _stale_or_refusal(request: web.Request, *, offered: bool) -> bool | web.Response:
    """Whether the request asks for a stale read, or the 400 for a ``stale`` that cannot be read or, where
    stale reads are not ``offered``, for asking one."""
    stale = stale_asked(request)
    if stale is None:
        return _unreadable_stale(request)
    if stale and not offered:
        return _invalid_stale(
            "stale reads are not offered here: this answer is read from the event log itself, not from this "
            "API's fold, so it cannot be given while the log is unreachable; leave stale out"
        )
    return stale


def refuses_stale(handler: Handler) -> Handler:
    """For a view that reads the log itself and never waits on the fold (``/v1/history``, ``/v1/usage``):
    ``?stale=true`` is refused with a 400 saying why, not silently ignored."""

    @functools.wraps(handler)
    async def read(request: web.Request) -> web.Response:
        refused = _stale_or_refusal(request, offered=False)
        return refused if isinstance(refused, web.Response) else await handler(request)

    return read


# -- the OpenAPI description of the above (openapi.py, history_openapi.py) ------------------------------

STALE_PARAMETER: dict[str, Any] = {
    "name": STALE_PARAM,
    "in": "query",
    "required": False,
    "schema": {"type": "string", "enum": ["true", "1", "false", "0", ""]},
    "description": "`true` (or `1`, or no value): answer at once from this API's fold without asking the "
    "event log where it ends; it may miss recent writes, but answers while the log is unreachable. "
    "Default: a linearizable read.",
}


def read_headers() -> dict[str, Any]:
    """The response headers of every fold read."""
    return {
        SEQ_HEADER: {
            "description": "The position in the event log (stream sequence) of the fold the answer was "
            "computed from.",
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
        },
        READ_HEADER: {
            "description": f"`{LINEARIZABLE}`: the answer holds every write acknowledged before the request; "
            f"`{STALE}`: this API's last known view, asked for with `stale`.",
            "schema": {"type": "string", "enum": [LINEARIZABLE, STALE]},
        },
    }


def document_fold_read(
    operation: dict[str, Any], problem_doc: Callable[[str], dict[str, Any]], *, stale: bool = True
) -> dict[str, Any]:
    """``operation`` with the headers on its 200, its 400 and 503 answers, and the ``stale`` parameter
    when offered (``stale`` False: a view that reads the log itself refuses it); ``problem_doc`` makes a
    problem+json response of a description."""
    responses = dict(operation["responses"])
    responses["200"] = {
        **responses["200"],
        "headers": {**responses["200"].get("headers", {}), **read_headers()},
    }
    refused = "`stale` is not true, 1, false or 0." if stale else "`stale=true` (not offered here)."
    unavailable = (
        "The event log did not say where it ends (`log-unavailable`: NATS unreachable, or still replaying), "
        "or this API's fold has not caught up with it (`not-visible`); see Retry-After."
    )
    if stale:
        unavailable += " `stale=true` answers from this API's fold meanwhile."
    for status, text in (("400", refused), ("503", unavailable)):
        previous = responses.get(status, {}).get("description")
        responses[status] = problem_doc(f"{previous} Or: {text}" if previous else text)
    out = {**operation, "responses": responses}
    if stale:
        out["parameters"] = [*operation.get("parameters", []), STALE_PARAMETER]
    return out
