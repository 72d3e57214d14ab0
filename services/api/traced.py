"""The API's part of a job's trace: one server span per request, continuing the caller's ``traceparent``
(a CI pipeline's trace) when it sends one. The submit's span context then rides on the appended
``JobSubmitted`` (``EventLog.append`` adds it), which every later service's span hangs from."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from rallypoint.observability.tracing import SpanKind, context_from_headers, enabled, span


@web.middleware
async def trace_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not enabled():
        return await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path
    attributes = {"http.request.method": request.method, "http.route": route}
    with span(
        f"{request.method} {route}",
        context_from_headers(request.headers),
        kind=SpanKind.SERVER,
        attributes=attributes,
    ) as current:
        response = await handler(request)
        current.set_attribute("http.response.status_code", response.status)
        return response
