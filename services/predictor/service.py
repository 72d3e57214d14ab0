"""`rally serve predictor`: every waiting job's predicted start (P50, P90), answered on
``q.predictor.starts``; a dry run's on ``q.predictor.dryrun`` (docs/prediction.md).

Alone, it follows the whole log from its start (runtimes are learned from every job that ever ended, so
it keeps no snapshot of its own); hosted with other services (``rally serve host``), it reads their
shared fold. It reads the scheduler leader's recorded settings, and refreshes its predictions every
``--interval`` seconds while the log moves. It writes nothing: any number of replicas answer the same."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Iterable, Sequence

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rallypoint.eventlog import EventLog, EventLogError
from rallypoint.events import JobSpec, SchedulerSettings, subjects
from rallypoint.predict.live import HORIZON_S, MAX_CYCLES, OutOfTime
from rallypoint.predict.refresh import JOBS_AHEAD_HEADER, Predictor, Settings
from rallypoint.runtime import ServiceConfig, ServiceContext, add_common_args, run_service
from rallypoint.runtime.cohost import Hosted
from rallypoint.runtime.follower import Follower
from rallypoint.runtime.following import open_follower
from rallypoint.runtime.metrics import add_collector

_log = logging.getLogger("rallypoint.predictor")


def settings_reader(log: EventLog) -> Settings:
    """The newest ``SchedulerSettings`` in the log; the last ones read while the log cannot answer (None:
    no leader recorded any yet)."""
    last: SchedulerSettings | None = None

    async def read() -> SchedulerSettings | None:
        nonlocal last
        try:
            seq = await log.last_seq(subjects.SCHEDULER_SETTINGS)
            event = (await log.get(seq)).event if seq else None
        except (EventLogError, TimeoutError, nats.errors.Error) as exc:
            _log.warning("scheduler settings not read (%s); predicting with the last ones", exc)
            return last
        if isinstance(event, SchedulerSettings):
            last = event
        return last

    return read


class _Gauges(Collector):
    """The predictor's ``/metrics``: refresh time, jobs predicted, and the accuracy measured so far."""

    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor

    def collect(self) -> Iterable[Metric]:
        p = self.predictor
        yield GaugeMetricFamily(
            "rally_prediction_refresh_seconds", "The last refresh's run time.", p.refresh_s
        )
        jobs = len(p.latest.jobs) if p.latest is not None else 0
        yield GaugeMetricFamily("rally_prediction_jobs", "Waiting jobs in the last refresh.", jobs)
        yield GaugeMetricFamily("rally_prediction_learned_jobs", "Ended jobs runtimes came from.", p.learned)
        yield CounterMetricFamily(
            "rally_prediction_dry_runs_estimated",
            "Dry runs answered from the last forecast, their own run forward taking too long.",
            p.dry_runs_estimated,
        )
        accuracy = GaugeMetricFamily(
            "rally_prediction_accuracy",
            "Share of scored jobs per measure (docs/prediction.md); absent until a job was scored.",
            labels=["measure"],
        )
        for measure, share in p.tracker.accuracy.shares().items():
            if share is not None:
                accuracy.add_metric([measure], share)
        yield accuracy


async def answer_queries(nc: Client, predictor: Predictor) -> list[Subscription]:
    """Answer ``q.predictor.starts`` (the latest refresh) and ``q.predictor.dryrun`` (a dry run's
    predicted start: a ``JobSpec`` in, a ``PredictedStart`` out, or ``{"error": ...}`` for a spec it
    cannot read or a prediction not made within ``Predictor.dry_run_budget_s``) on ``nc``, in the queue group
    ``predictor``: any number of replicas share the queries. ``rally bench dryrun`` serves them so too."""

    async def answer(msg: Msg) -> None:
        await msg.respond(predictor.encoded)

    async def dry_run(msg: Msg) -> None:
        try:
            spec = msgspec.json.decode(msg.data, type=JobSpec)
            start = await predictor.dry_run(spec, jobs_ahead=_jobs_ahead(msg))
        except (msgspec.DecodeError, msgspec.ValidationError, OutOfTime, ValueError) as exc:
            await msg.respond(msgspec.json.encode({"error": str(exc)}))
            return
        await msg.respond(msgspec.json.encode(start))

    return [
        await nc.subscribe(subjects.query("predictor", "starts"), queue="predictor", cb=answer),
        await nc.subscribe(subjects.query("predictor", "dryrun"), queue="predictor", cb=dry_run),
    ]


def _jobs_ahead(msg: Msg) -> int | None:
    """The dry run's place in the policy's order at the API's cycle (``JOBS_AHEAD_HEADER``); None when
    the API did not say (every waiting job is then ahead of it). ``ValueError`` for one that is no count."""
    raw = (msg.headers or {}).get(JOBS_AHEAD_HEADER)
    if raw is None:
        return None
    ahead = int(raw)
    if ahead < 0:
        raise ValueError(f"{JOBS_AHEAD_HEADER} must be a count, got {raw!r}")
    return ahead


#: Predictions are relative to the clock as well as to the log: refresh at least this often when idle.
STALE_S = 60.0


async def refresh_forever(
    ctx: ServiceContext, follower: Follower, predictor: Predictor, interval: float
) -> None:
    """Learn from what changed, then refresh when the log moved (or the last refresh grew old)."""
    changes = follower.changes()
    refreshed_seq, refreshed_at = -1, 0.0
    while not ctx.stopping:
        taken = changes.take()
        predictor.observe(None if taken.everything else set(taken.jobs))
        moved = follower.state.last_seq != refreshed_seq
        if moved or time.monotonic() - refreshed_at > STALE_S:
            refreshed_seq, refreshed_at = follower.state.last_seq, time.monotonic()
            predictions = await predictor.refresh()
            _log.debug("predicted %d waiting jobs in %.3fs", len(predictions.jobs), predictor.refresh_s)
        await ctx.until_stopped(asyncio.sleep(interval))


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(*prepare(argv))


def prepare(argv: Sequence[str] | None = None) -> Hosted:
    """The service's main coroutine and configuration from its arguments: run alone (``main``) or
    hosted with others in one process (``rally serve host``, ``runtime.cohost``), where it reads the
    host's shared fold: a fold restored from a snapshot holds every job that ever ended (the fold keeps
    them all), so it learns the same runtimes as from a replay."""
    args = parse(argv)
    config = ServiceConfig.from_args("predictor", args)

    async def run(ctx: ServiceContext) -> int:
        follower = await open_follower(ctx, snapshots=False)
        log = await ctx.event_log()
        predictor = Predictor(
            lambda: follower.state,
            settings_reader(log),
            horizon_s=args.horizon,
            max_cycles=args.max_cycles,
        )
        add_collector(ctx, _Gauges(predictor))
        await answer_queries(await ctx.nats(), predictor)
        await refresh_forever(ctx, follower, predictor, args.interval)
        return 0

    return run, config


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rally serve predictor", description=__doc__)
    add_common_args(parser)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between refreshes (default 5)")
    parser.add_argument(
        "--horizon", type=float, default=HORIZON_S, help="seconds ahead a start is predicted (default 7 days)"
    )
    parser.add_argument(
        "--max-cycles", type=int, default=MAX_CYCLES, help="scheduling cycles one run forward may take"
    )
    return parser.parse_args(argv)
