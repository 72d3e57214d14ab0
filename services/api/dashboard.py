"""The web dashboard: static files served by the API at ``GET /`` (docs/observability.md).

Plain HTML, JS and SVG, no build step and nothing fetched from the internet. The page reads the same API
the CLI uses (``/v1/nodes``, ``/v1/jobs``, ``/v1/jobs/{id}`` and its history and logs, ``/v1/state``,
``/v1/queues``, ``/v1/history``, and ``/v1/usage/history`` for its usage chart) with the caller's bearer
token (``?token=`` once, then kept in the browser's localStorage), so it shows what that token may see.
The files themselves carry no data: they are public (``auth.PUBLIC_PATHS`` and ``PUBLIC_PREFIXES``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

STATIC_DIR = Path(__file__).resolve().parent / "static"
#: The files served under /dashboard/: a fixed list, so no request path can name anything else.
ASSETS: dict[str, str] = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
_NO_CACHE = {"Cache-Control": "no-cache"}  # a new version shows on the next reload


async def index(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers=_NO_CACHE)


async def asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.FileResponse(STATIC_DIR / name, headers={**_NO_CACHE, "Content-Type": ASSETS[name]})


def add_dashboard_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/dashboard/{name}", asset)


def dashboard_paths() -> dict[str, Any]:
    """The dashboard's OpenAPI paths (public: no token needed, no data in them)."""

    def page(operation_id: str, summary: str, media: str) -> dict[str, Any]:
        ok = {"description": summary, "content": {media: {"schema": {"type": "string"}}}}
        return {"get": {"operationId": operation_id, "summary": summary, "responses": {"200": ok}}}

    asset_doc = page("dashboardAsset", "A file of the dashboard (script or style sheet)", "text/javascript")
    # the style sheet is text/css: both are documented, or a client checking the type refuses the CSS
    asset_doc["get"]["responses"]["200"]["content"]["text/css"] = {"schema": {"type": "string"}}
    asset_doc["get"]["parameters"] = [
        {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": sorted(ASSETS)}}
    ]
    asset_doc["get"]["responses"]["404"] = {"description": "No such file."}
    return {"/": page("dashboard", "The web dashboard (HTML)", "text/html"), "/dashboard/{name}": asset_doc}
