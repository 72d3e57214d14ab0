"""``JobTraces`` keeps a submission's trace parent only while this process traces: without tracing the
submission's headers are never parsed (every fold notes every ``JobSubmitted``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from opentelemetry.sdk.trace import TracerProvider

from rallypoint.eventlog.log import Recorded
from rallypoint.events import JobSpec, JobSubmitted
from rallypoint.observability import tracing
from rallypoint.observability.jobtraces import JobTraces

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class CountingEnvelope(Mapping[str, str]):
    """An envelope that counts its reads (``feeds.LazyEnvelope`` parses the headers on the first)."""

    def __init__(self) -> None:
        self.reads = 0

    def __getitem__(self, key: str) -> str:
        self.reads += 1
        return {"traceparent": PARENT}[key]

    def __iter__(self) -> Iterator[str]:
        self.reads += 1
        return iter(["traceparent"])

    def __len__(self) -> int:
        return 1


def _submitted(envelope: Mapping[str, str]) -> Recorded:
    spec = JobSpec(name="j", team="nlp", gpus=1, gpus_per_task=1, ranks_per_task=1, command=("true",))
    event = JobSubmitted(job_id="j1", spec=spec, submitted_at=1.0)
    return Recorded(seq=1, subject="rally.job.j1", event=event, envelope=envelope)


def test_without_tracing_the_submission_headers_stay_unread() -> None:
    tracing.uninstall()
    traces, envelope = JobTraces(), CountingEnvelope()
    traces.note(_submitted(envelope))
    assert envelope.reads == 0
    assert traces.context("j1") is None


def test_while_tracing_the_submission_parent_is_kept() -> None:
    tracing.install(TracerProvider())
    try:
        traces, envelope = JobTraces(), CountingEnvelope()
        traces.note(_submitted(envelope))
        assert envelope.reads > 0
        assert traces.context("j1") is not None
    finally:
        tracing.uninstall()
