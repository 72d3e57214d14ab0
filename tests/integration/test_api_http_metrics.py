"""The API's /metrics counts its own requests by route pattern, method and status, with their latency."""

from __future__ import annotations

from aiohttp import test_utils
from prometheus_client.parser import text_string_to_metric_families
from rallypoint_services.api.app import build_app

from rallypoint.eventlog import EventLog


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def test_requests_are_counted_by_route_pattern_method_and_status(event_log: EventLog) -> None:
    app = build_app(event_log)
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        before = await (await client.get("/metrics")).text()
        route = {"route": "/v1/jobs/{job_id}", "method": "GET", "status": "404"}
        for job_id in ("j-nope-1", "j-nope-2"):
            assert (await client.get(f"/v1/jobs/{job_id}")).status == 404
        assert (await client.get("/no/such/page")).status == 404
        after = await (await client.get("/metrics")).text()
    assert (
        sample(after, "rally_api_requests_total", **route)
        - sample(before, "rally_api_requests_total", **route)
        == 2
    )
    assert sample(after, "rally_api_requests_total", route="unmatched", status="404") >= 1
    latency = {"route": "/v1/jobs/{job_id}", "method": "GET"}
    assert sample(after, "rally_api_request_duration_seconds_count", **latency) >= 2
    assert sample(after, "rally_jobs", state="pending") == 0, "the API's own families are still there"
