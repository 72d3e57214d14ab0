"""The wait before every read (``FoldFollower.wait_current``) and the 503 each way it can fail ends in."""

from __future__ import annotations

from aiohttp import web

from rallypoint.eventlog import LogUnavailable

from .fold import FoldFollower, NotVisible, Replaying
from .problems import problem, unavailable


async def ready_to_read(follower: FoldFollower, timeout: float) -> web.Response | None:
    """None once the fold holds every write acknowledged before the read began; else the 503 to answer."""
    try:
        await follower.wait_current(timeout)
    except Replaying:
        return unavailable("the API is still replaying the event log; retry shortly")
    except LogUnavailable as exc:
        # Without the log's answer this instance cannot know what it has not seen yet: a 200 from its
        # fold could be a 404 for a job another replica accepted.
        return unavailable(f"the event log did not say where it ends ({exc}); retry shortly")
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
