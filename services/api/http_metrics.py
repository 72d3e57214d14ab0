"""The API's own request metrics, the RED signals an SRE expects from any HTTP service: requests by route,
method and status, and their latency. Routes are the router's patterns (``/v1/jobs/{job_id}``), never raw
paths, so a scan of random URLs cannot grow the series without bound (it counts under ``unmatched``)."""

from __future__ import annotations

import time

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import Counter, Histogram

# Importing the process's instruments turns off `_created` samples, for these counters too.
from rallypoint.observability import instruments as _instruments  # noqa: F401
from rallypoint.observability.children import LabelChildren

API_REQUESTS = Counter(
    "rally_api_requests",
    "HTTP requests the API answered, by route pattern, method and status.",
    ["route", "method", "status"],
)
API_REQUEST_SECONDS = Histogram(
    "rally_api_request_duration_seconds",
    "Time to answer an HTTP request, by route pattern and method.",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


_requests = LabelChildren(API_REQUESTS)
_durations = LabelChildren(API_REQUEST_SECONDS)


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500  # an exception that is not an HTTP answer becomes one
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as answer:
        status = answer.status
        raise
    finally:
        route = _route(request)
        _requests.get(route, request.method, str(status)).inc()
        _durations.get(route, request.method).observe(time.perf_counter() - started)
