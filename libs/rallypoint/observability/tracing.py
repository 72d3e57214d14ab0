"""OpenTelemetry traces across the services, their context carried through the log (docs/observability.md).

One trace per job submission: the API's request span is the root (or continues the caller's
``traceparent``); its context travels in the ``JobSubmitted`` message's ``ce-traceparent`` header (the
CloudEvents distributed-tracing extension, binary mode), and every service that acts on the job later
parents its span on it: the scheduler's ``queued`` / ``bind`` / ``recovery``, the job controller's
``launch``, whose context goes on in the launch request's headers to the agent's ``agent.launch``.

Tracing is off (a no-op tracer, next to no cost on the hot paths) until ``setup_tracing`` finds an OTLP
endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``) and an exporter package, or a test calls ``install``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import NoOpTracer, Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_log = logging.getLogger("rallypoint.tracing")

#: The header an event carries its trace context in (read back: ``Recorded.envelope["traceparent"]``).
TRACEPARENT_HEADER = "ce-traceparent"
_W3C = TraceContextTextMapPropagator()
_tracer: Tracer = NoOpTracer()


def install(provider: TracerProvider) -> None:
    """Trace with ``provider`` from now on (``setup_tracing``; tests pass one with an in-memory exporter)."""
    global _tracer
    _tracer = provider.get_tracer("rallypoint")


def uninstall() -> None:
    global _tracer
    _tracer = NoOpTracer()


def enabled() -> bool:
    return not isinstance(_tracer, NoOpTracer)


def tracer() -> Tracer:
    return _tracer


def setup_tracing(service: str, instance: str) -> bool:
    """Export this process's spans with OTLP when an endpoint is configured and an exporter is installed;
    otherwise leave tracing off. True when it is on."""
    exporter = _otlp_exporter()
    if exporter is None:
        return False
    resource = Resource.create({"service.name": f"rallypoint-{service}", "service.instance.id": instance})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    install(provider)
    return True


def _otlp_exporter() -> SpanExporter | None:
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    try:  # the HTTP exporter first: no gRPC toolchain needed
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter,
            )
        except ImportError:
            _log.warning(
                "OTEL_EXPORTER_OTLP_ENDPOINT is set but no OTLP exporter is installed "
                "(pip install opentelemetry-exporter-otlp-proto-http): tracing stays off"
            )
            return None
    exporter: SpanExporter = OTLPSpanExporter()
    return exporter


def trace_headers() -> dict[str, str]:
    """The current span's context for an appended event or a request (empty when nothing is traced)."""
    if not enabled():
        return {}
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    parent = carrier.get("traceparent")
    return {TRACEPARENT_HEADER: parent} if parent else {}


def context_from(traceparent: str | None) -> Context | None:
    """The remote context a ``traceparent`` names (None for none)."""
    if not traceparent:
        return None
    return _W3C.extract({"traceparent": traceparent})


def context_from_headers(headers: Mapping[str, str] | None) -> Context | None:
    """The context a message's headers carry (``ce-traceparent`` or a plain ``traceparent``)."""
    if not headers:
        return None
    return context_from(headers.get(TRACEPARENT_HEADER) or headers.get("traceparent"))


@contextmanager
def span(
    name: str,
    parent: Context | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    start_s: float | None = None,
    attributes: dict[str, Any] | None = None,
) -> Iterator[Span]:
    """A span under ``parent`` (else the current one), current inside the block. ``start_s``: a wall
    clock start in the past (a job's wait, known only when it ends)."""
    start = int(start_s * 1e9) if start_s is not None else None
    with _tracer.start_as_current_span(
        name, context=parent, kind=kind, start_time=start, attributes=attributes
    ) as current:
        yield current


def record_span(
    name: str,
    parent: Context | None,
    *,
    start_s: float,
    end_s: float,
    attributes: dict[str, Any] | None = None,
) -> None:
    """A span that already happened (from ``start_s`` to ``end_s``, wall clock seconds)."""
    if not enabled():
        return
    done = _tracer.start_span(name, context=parent, start_time=int(start_s * 1e9), attributes=attributes)
    done.end(end_time=int(max(end_s, start_s) * 1e9))
