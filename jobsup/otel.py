"""OpenTelemetry tracing: one trace from the request that enqueued a job through each of its attempts.

Turned on for a process by JOBSUP_OTEL=1 in its environment (a supervisor's workers inherit it), or by
`jobsup.otel.instrument()`; it uses the global tracer provider, which the application configures (in the
module of its App, which every worker imports). Its middleware are the process's own, which
jobsup.middleware runs outside every app's (ENQUEUE and RUN below: jobsup.middleware imports this module,
not the reverse):

- each enqueue inside an active span records a PRODUCER span `send <kind>`, a child of it, and stores
  that span's W3C context (traceparent, tracestate, and baggage if any) in the job's meta; outside a
  span it records and stores nothing;
- each attempt runs in a CONSUMER span `process <kind>` whose parent is the context stored with the
  job (and which links to it, as the messaging conventions ask), with the conventions' attributes
  (messaging.system "jobsup", messaging.destination.name the queue, messaging.operation.type,
  messaging.message.id the job id) and jobsup.kind, jobsup.attempt, jobsup.max_attempts. A failure
  records its exception, sets the status ERROR and error.type (see error_type); jobsup.outcome says
  how every attempt ended.

This module imports opentelemetry only in instrument(): the supervisor imports it for trace_fields(),
and a process that does not turn tracing on never imports opentelemetry at all.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Generator
from typing import Any

from jobsup.job import Job, JobSpec
from jobsup.outcomes import AttemptStopped, RunOutcome

SYSTEM = "jobsup"  # messaging.system
# How long an attempt stopped from outside waits for its spans to be exported before the worker ends
# (the supervisor kills it after its kill grace, 2 s).
STOP_FLUSH_MILLIS = 1000

NEEDS = "jobsup.otel needs opentelemetry-api: pip install 'jobsup[otel]'"

_state: dict[str, Any] = {}  # once instrumented: the tracer and the API's names this module uses

# The process's own enqueue and run middleware (jobsup.middleware.process() runs them outside every app's):
# tracing's while it is on, else none. Changed in place: jobsup.middleware holds these very lists.
ENQUEUE: list[tuple[str, Callable[[JobSpec, dict[str, Any]], None]]] = []
RUN: list[tuple[str, Callable[[Job], Generator[None, RunOutcome, None]]]] = []

# (trace id, span id) in hex of the attempt running in this context, when traced: jobsup.middleware.Attempt
# reads it once tracing has started the attempt's span and gives it to the supervisor's log lines about
# it. A context variable, since jobs that share a worker process run at once, each in a task or thread.
_attempt_trace: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "jobsup_attempt_trace", default=None
)


def attempt_trace() -> tuple[str, str] | None:
    """The trace and span of the attempt running in this context, if tracing started its span."""
    return _attempt_trace.get()


def forget_trace() -> None:
    """Before an attempt starts: the trace of the one before it in this context is not its."""
    _attempt_trace.set(None)


def instrument() -> None:
    """Trace every enqueue and every run of this process (again: nothing more). ImportError when
    opentelemetry-api is not installed."""
    if _state:
        return
    try:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    except ImportError:
        raise ImportError(NEEDS) from None
    # The package's version as jobsup.__version__ reads it, without importing the package's __init__,
    # which names the modules above this one.
    from importlib.metadata import version

    _state.update(
        tracer=trace.get_tracer("jobsup", version("jobsup")),
        trace=trace,
        context=context,
        propagate=propagate,
        Link=Link,
        SpanKind=SpanKind,
        Status=Status,
        StatusCode=StatusCode,
    )
    ENQUEUE.insert(0, ("jobsup.otel", _traced_enqueue))
    RUN.insert(0, ("jobsup.otel", _traced_run))
    # Imported here: jobsup.middleware imports this module on every enqueue path, tracing on or not.
    import multiprocessing
    import multiprocessing.util

    if multiprocessing.parent_process() is not None:
        # A worker process ends through multiprocessing, which runs its own finalizers but not atexit's,
        # where the SDK's provider exports what its batch processor still holds.
        multiprocessing.util.Finalize(None, _flush, exitpriority=10)


def unavailable() -> str | None:
    """Why instrument() would fail in this environment, or None when opentelemetry-api imports. The
    supervisor asks once, for its workers, when JOBSUP_OTEL is set (this imports opentelemetry)."""
    try:
        import opentelemetry.propagate
        import opentelemetry.trace  # noqa: F401 (imported to see that it can be)
    except ImportError:
        return NEEDS
    return None


def uninstrument() -> None:
    """Stop tracing this process's enqueues and runs (tests)."""
    if not _state:
        return
    ENQUEUE[:] = [m for m in ENQUEUE if m[1] is not _traced_enqueue]
    RUN[:] = [m for m in RUN if m[1] is not _traced_run]
    _state.clear()


def _attributes(kind: str, queue: str, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "jobsup.kind": kind,
    }


def _traced_enqueue(spec: JobSpec, meta: dict[str, Any]) -> None:
    trace = _state["trace"]
    active = trace.get_current_span()
    if not active.get_span_context().is_valid:
        return  # no trace to continue: nothing is stored, and the attempts start traces of their own
    span = _state["tracer"].start_span(
        f"send {spec.kind}", kind=_state["SpanKind"].PRODUCER, attributes=_attributes(spec.kind, spec.queue, "send")
    )
    # The producer span is the job's creation context: each attempt's span is its child. It ends here,
    # before the insert, which is the caller's (and may be part of the caller's transaction).
    _state["propagate"].inject(meta, context=trace.set_span_in_context(span))
    span.end()


def _traced_run(job: Job) -> Generator[None, RunOutcome, None]:
    trace, context = _state["trace"], _state["context"]
    # The root context when the job carries none: the attempt starts a trace of its own.
    parent = _state["propagate"].extract(job.meta or {})
    creation = trace.get_current_span(parent).get_span_context()
    attributes = _attributes(job.kind, job.queue, "process")
    attributes.update(
        {"messaging.message.id": str(job.id), "jobsup.attempt": job.attempts, "jobsup.max_attempts": job.max_attempts}
    )
    span = _state["tracer"].start_span(
        f"process {job.kind}",
        context=parent,
        kind=_state["SpanKind"].CONSUMER,
        attributes=attributes,
        links=[_state["Link"](creation)] if creation.is_valid else None,
    )
    ids = span.get_span_context()
    if span.is_recording():  # not a no-op tracer's stand-in, which carries the producer's ids
        _attempt_trace.set((trace.format_trace_id(ids.trace_id), trace.format_span_id(ids.span_id)))
    token = context.attach(trace.set_span_in_context(span))
    outcome = RunOutcome("failed", error=RuntimeError("the attempt ended without an outcome"))
    try:
        outcome = yield
    finally:
        stopped = isinstance(outcome.error, AttemptStopped)
        if not stopped:  # a stop runs in a signal handler, maybe in another context: the process ends
            context.detach(token)
        _end(span, outcome)
        if stopped:
            _flush()


def _end(span: Any, outcome: RunOutcome) -> None:
    span.set_attribute("jobsup.outcome", outcome.status)
    error = outcome.error
    if outcome.status in ("failed", "timed_out") and error is not None:
        span.record_exception(error)
        span.set_status(_state["Status"](_state["StatusCode"].ERROR, _describe(error)))
        span.set_attribute("error.type", error_type(outcome.status, error))
    elif outcome.status in ("snoozed", "discarded") and error is not None:
        # Not failures: the handler said what becomes of the job, and the event says what it said.
        span.add_event(f"jobsup.{outcome.status}", {"jobsup.reason": str(error)})
    elif outcome.status in ("cancelled", "interrupted") and error is not None:
        span.add_event(f"jobsup.{outcome.status}", {"jobsup.reason": str(error)})
    span.end()


def error_type(status: str, error: BaseException) -> str:
    """The `error.type` of a failed attempt, which the messaging conventions require on a failed
    operation and only there: `timeout` for an attempt past its timeout (the conventions' own word),
    else the exception's class, by its fully qualified name (a builtin's by its name alone, as
    `exception.type` has it). Low in cardinality: one value per class of error, never the message.

    >>> class Declined(Exception): ...
    >>> error_type("failed", ValueError()), error_type("failed", Declined()), error_type("timed_out", ValueError())
    ('ValueError', 'jobsup.otel.Declined', 'timeout')
    """
    if status == "timed_out":
        return "timeout"
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _flush() -> None:
    """Export what the provider still holds (a batch processor's queue), if it can say so."""
    trace = _state.get("trace")
    flush = getattr(trace.get_tracer_provider(), "force_flush", None) if trace is not None else None
    if flush is not None:
        flush(STOP_FLUSH_MILLIS)


# --- the supervisor's log lines --------------------------------------------------------------------


def trace_fields(meta: Any, reported: tuple[str, str] | None = None) -> dict[str, str]:
    """The trace_id and span_id of a log line about a job: those its worker reported for the attempt
    (its span), else the trace its meta carries (the enqueue's span); {} for a job that has neither.
    `meta` is the claim's: JSON text, a dict, or None.

    >>> trace_fields('{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}')
    {'trace_id': '4bf92f3577b34da6a3ce929d0e0e4736'}
    >>> trace_fields(None, ("4bf92f3577b34da6a3ce929d0e0e4736", "53995c3f42cd8ad8"))
    {'trace_id': '4bf92f3577b34da6a3ce929d0e0e4736', 'span_id': '53995c3f42cd8ad8'}
    >>> trace_fields(None), trace_fields({"tenant": "a"})
    ({}, {})
    """
    if reported is not None:
        return {"trace_id": reported[0], "span_id": reported[1]}
    if not meta:
        return {}
    if isinstance(meta, str):
        if "traceparent" not in meta:
            return {}
        try:
            meta = json.loads(meta)
        except ValueError:
            return {}
    parent = meta.get("traceparent") if isinstance(meta, dict) else None
    parts = parent.split("-") if isinstance(parent, str) else []
    if len(parts) < 4 or len(parts[1]) != 32:
        return {}
    return {"trace_id": parts[1]}
