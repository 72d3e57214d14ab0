"""The scheduler's spans land in the job's trace: queued from submission to bind, and a recovery span from
the interruption to the repair (``rallypoint.observability.decision_spans``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rallypoint.eventlog import Recorded
from rallypoint.events import (
    GangBound,
    GangRepaired,
    JobInterrupted,
    JobSpec,
    JobSubmitted,
    NodeSwap,
    TaskPlacement,
)
from rallypoint.observability import observe_writes, tracing
from rallypoint.observability.jobtraces import JobTraces
from rallypoint.state import ClusterState

TRACE = "0af7651916cd43dd8448eb211c80319c"
SUBMIT_SPAN = "b7ad6b7169203331"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing.install(provider)
    yield spans
    tracing.uninstall()


def submitted() -> JobSubmitted:
    spec = JobSpec(name="j", team="nlp", gpus=8, gpus_per_task=8, ranks_per_task=1, command=("true",))
    return JobSubmitted(job_id="j1", spec=spec, submitted_at=100.0)


def test_queued_bind_and_recovery_spans_hang_from_the_submission(exporter: InMemorySpanExporter) -> None:
    traces = JobTraces()
    event = submitted()
    envelope = {"traceparent": f"00-{TRACE}-{SUBMIT_SPAN}-01"}
    traces.note(Recorded(seq=1, subject="rally.job.j1", event=event, envelope=envelope))
    state = ClusterState()
    state.apply(1, event)
    placements = (TaskPlacement(task=0, node_id="n1", gpus=tuple(range(8))),)
    bound = GangBound(
        job_id="j1",
        attempt=1,
        epoch=1,
        placements=placements,
        computed_at_seq=1,
        policy_version="v",
        now=130.0,
        at=130.0,
    )
    observe_writes([bound], state, 130.0, traces)
    interrupted = JobInterrupted(job_id="j1", attempt=1, failed_nodes=("n1",), reason="node lost", at=200.0)
    traces.note(Recorded(seq=5, subject="rally.ctl.job.j1", event=interrupted, envelope={}))
    repaired = GangRepaired(
        job_id="j1",
        attempt=2,
        epoch=1,
        placements=placements,
        swaps=(NodeSwap(task=0, from_node="n1", to_node="n2"),),
        computed_at_seq=5,
        policy_version="v",
        now=215.0,
        at=215.0,
    )
    observe_writes([repaired], state, 215.0, traces)

    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"queued", "bind", "recovery"}
    for span in spans.values():
        assert span.context is not None and format(span.context.trace_id, "032x") == TRACE
        assert span.parent is not None and format(span.parent.span_id, "016x") == SUBMIT_SPAN
    queued, recovery = spans["queued"], spans["recovery"]
    assert (queued.start_time, queued.end_time) == (100 * 10**9, 130 * 10**9)
    assert (recovery.start_time, recovery.end_time) == (200 * 10**9, 215 * 10**9)
    assert recovery.attributes is not None and recovery.attributes["rally.outcome"] == "repaired"
    assert list(recovery.attributes["rally.swaps"]) == ["n1->n2"]


def test_nothing_is_recorded_while_tracing_is_off() -> None:
    traces = JobTraces()
    state = ClusterState()
    state.apply(1, submitted())
    assert not tracing.enabled()
    assert tracing.trace_headers() == {}
    with tracing.span("anything"):
        assert tracing.trace_headers() == {}
    observe_writes([], state, 1.0, traces)
