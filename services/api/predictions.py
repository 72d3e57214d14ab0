"""Predicted starts in the API's job views: the predictor service's latest answer (``q.predictor.starts``).

The API asks at most once per ``CACHE_S`` (concurrent readers share the question) and renders, for each
waiting job, what the answer says of it. Without an answer (no predictor running, or it did not answer in
time) a pending job's ``predicted_start`` says so instead of guessing (status ``unavailable``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
import nats.errors
from aiohttp import web
from nats.aio.client import Client

from rallypoint.events import JobSpec, subjects
from rallypoint.predict.live import PredictedStart
from rallypoint.predict.refresh import JOBS_AHEAD_HEADER, Answer
from rallypoint.predict.tracking import Accuracy
from rallypoint.state import JobView

__all__ = [
    "CACHE_S",
    "StartPredictions",
    "add_predictions_route",
    "predictions_paths",
    "predictions_schemas",
    "render_predicted_start",
]
_REF = "#/components/schemas/{name}"

_log = logging.getLogger("rallypoint.api.predictions")


CACHE_S = 2.0
ASK_TIMEOUT_S = 1.0
# A dry run's prediction is a run forward of its own: the answer waits for it, up to this long.
DRY_RUN_TIMEOUT_S = 2.0
_decode = msgspec.json.Decoder(Answer).decode
_decode_reply = msgspec.json.Decoder(dict[str, Any]).decode
_UNAVAILABLE = {"status": "unavailable", "detail": "the predictor has not answered (is it running?)"}


class StartPredictions:
    """The latest answer of the predictor, asked for at most every ``CACHE_S``."""

    def __init__(self, nats_client: Callable[[], Client], *, cache_s: float = CACHE_S) -> None:
        self._client = nats_client
        self.cache_s = cache_s
        self._answer: Answer | None = None
        self._asked_at = -float("inf")
        self._asking: asyncio.Future[Answer | None] | None = None

    async def current(self) -> Answer | None:
        if time.monotonic() - self._asked_at < self.cache_s:
            return self._answer
        if self._asking is None:
            self._asking = asyncio.ensure_future(self._ask())
        asking = self._asking
        try:
            return await asyncio.shield(asking)
        finally:
            if asking.done() and self._asking is asking:
                self._asking = None

    async def _ask(self) -> Answer | None:
        try:
            nc = self._client()
            reply = await nc.request(subjects.query("predictor", "starts"), b"", timeout=ASK_TIMEOUT_S)
            self._answer = _decode(reply.data)
        except (nats.errors.Error, TimeoutError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            _log.debug("no predicted starts (%s)", type(exc).__name__)
            self._answer = None
        self._asked_at = time.monotonic()
        return self._answer

    async def dry_run(self, spec: JobSpec, *, jobs_ahead: int | None = None) -> dict[str, Any]:
        """When a job of ``spec`` submitted now would start, as the predictor runs it forward;
        ``jobs_ahead``: its place in the policy's order at this API's cycle (``JOBS_AHEAD_HEADER``), for a
        prediction fitted into the predictor's last forecast."""
        headers = None if jobs_ahead is None else {JOBS_AHEAD_HEADER: str(jobs_ahead)}
        try:
            reply = await self._client().request(
                subjects.query("predictor", "dryrun"),
                msgspec.json.encode(spec),
                timeout=DRY_RUN_TIMEOUT_S,
                headers=headers,
            )
            raw = _decode_reply(reply.data)
            # ``{"error": ...}``: no prediction made (a spec it cannot read, or none within its budget)
            refusal = raw.get("error")
            start = None if refusal is not None else msgspec.convert(raw, PredictedStart)
        except (nats.errors.Error, TimeoutError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            _log.debug("no dry-run prediction (%s)", type(exc).__name__)
            return dict(_UNAVAILABLE)
        if start is None:
            return {"status": "unavailable", "detail": f"the predictor made no prediction: {refusal}"}
        return {**_start_fields(start), "computed_at": time.time()}


def render_predicted_start(job: JobView, answer: Answer | None) -> dict[str, Any] | None:
    """A pending job's predicted start as the answer has it; None for a job that is not waiting."""
    if job.state != "pending":
        return None
    predictions = answer.predictions if answer is not None else None
    if answer is None or predictions is None:
        return dict(_UNAVAILABLE)
    computed = {"computed_at": predictions.now, "computed_at_seq": predictions.seq, "policy": answer.policy}
    start = predictions.jobs.get(job.job_id)
    if start is None:
        detail = "submitted after the last prediction, or not yet looked at by a scheduling cycle"
        return {"status": "pending-refresh", "detail": detail, **computed}
    return {**_start_fields(start), "horizon_s": predictions.horizon_s, **computed}


def _start_fields(start: PredictedStart) -> dict[str, Any]:
    """``predicted`` from a run forward with the job in it; ``estimated`` when fitted into the predictor's
    last forecast (a dry run whose own run took too long: ``forecast_seq`` and ``forecast_at`` say which)."""
    fields: dict[str, Any] = {
        "status": "beyond-horizon" if start.p50 is None else "predicted",
        "p50": start.p50,
        "p90": start.p90,
        "runtime_p50_s": start.runtime_p50_s,
        "runtime_from": start.runtime_key,
    }
    if start.basis == "forecast":
        fields["basis"] = "forecast"
        fields["forecast_seq"], fields["forecast_at"] = start.forecast_seq, start.forecast_at
        if start.p50 is not None:
            fields["status"] = "estimated"
    return fields


class PredictionsSummary(msgspec.Struct, kw_only=True):
    """``GET /v1/predictions``: how the cluster's predictions are made now and how good they were.
    ``available`` false: no predictor answered (the rest is then empty). ``accuracy``: counts since the
    predictor started; ``shares``: the same as shares of the jobs scored (null before any)."""

    available: bool
    policy: str | None = None
    computed_at: float | None = None
    computed_at_seq: int | None = None
    refresh_s: float | None = None
    waiting_jobs: int = 0
    learned_jobs: int = 0
    horizon_s: float | None = None
    accuracy: Accuracy | None = None
    shares: dict[str, float | None] = {}


def summary(answer: Answer | None) -> PredictionsSummary:
    if answer is None:
        return PredictionsSummary(available=False)
    found = answer.predictions
    return PredictionsSummary(
        available=True,
        policy=answer.policy,
        computed_at=found.now if found else None,
        computed_at_seq=found.seq if found else None,
        refresh_s=answer.refresh_s,
        waiting_jobs=len(found.jobs) if found else 0,
        learned_jobs=found.learned_jobs if found else 0,
        horizon_s=found.horizon_s if found else None,
        accuracy=answer.accuracy,
        shares=answer.shares,
    )


def add_predictions_route(app: web.Application, predictions: StartPredictions) -> None:
    """``GET /v1/predictions``: any token (it names no job)."""

    async def get(_: web.Request) -> web.Response:
        body = msgspec.json.encode(summary(await predictions.current()))
        return web.Response(body=body, content_type="application/json")

    app.router.add_get("/v1/predictions", get)


def predictions_schemas() -> dict[str, Any]:
    _, components = msgspec.json.schema_components([PredictionsSummary], ref_template=_REF)
    return components


def predictions_paths() -> dict[str, Any]:
    ok = {"application/json": {"schema": {"$ref": _REF.format(name="PredictionsSummary")}}}
    return {
        "/v1/predictions": {
            "get": {
                "operationId": "getPredictions",
                "summary": "How start times are predicted now (policy, log position, history learned from) "
                "and how good the predictions were (docs/prediction.md)",
                "responses": {"200": {"description": "The predictor's summary.", "content": ok}},
            }
        }
    }
