"""The apps of tests/test_middleware.py and tests/test_otel.py.

`tenants` has middleware of its own: an enqueue middleware storing the tenant of the enqueuing code
(TENANT) in the job's meta, and run middleware that record what they see. `app` has none: it is traced
by jobsup.otel when JOBSUP_OTEL=1. Run by a real `jobsup start` with TRACED_SPANS_DIR set, this module
configures the worker's tracer provider, as an application's module does, with an exporter that appends
each finished span to a file of the process's own in that directory, where the test reads them (as
each ends, or with TRACED_BATCH set, through a batch processor that holds them until the worker ends).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import time
from collections.abc import Generator
from typing import Any

from jobsup import App, Job, JobSpec, RunOutcome, Snooze

# --- tenants: middleware of an app's own ------------------------------------------------------------

TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
# What the middleware and handlers of `tenants` saw, in order, in this process (drain's).
SEEN: list[tuple] = []

tenants = App()


@tenants.enqueue_middleware
def tenant(spec: JobSpec, meta: dict[str, Any]) -> None:
    if TENANT.get() is not None:
        meta["tenant"] = TENANT.get()


@tenants.enqueue_middleware
def stamped_after(spec: JobSpec, meta: dict[str, Any]) -> None:
    # Registered second: sees what `tenant` wrote.
    meta["seen"] = sorted(meta)


@tenants.run_middleware
def tenant_context(job: Job) -> Generator[None, RunOutcome, None]:
    token = TENANT.set((job.meta or {})["tenant"])  # a job enqueued with no tenant fails here
    SEEN.append(("outer", "before", job.id))
    try:
        outcome = yield
        SEEN.append(("outer", "after", job.id, outcome.status, type(outcome.error).__name__, outcome.value))
    finally:
        TENANT.reset(token)


@tenants.run_middleware
def inner(job: Job) -> Generator[None, RunOutcome, None]:
    SEEN.append(("inner", "before", job.id))
    if job.payload.get("inner_fails") == "before":
        raise LookupError("inner, before")
    if job.payload.get("inner_snoozes"):
        raise Snooze(60)
    outcome = yield
    SEEN.append(("inner", "after", job.id, outcome.status, type(outcome.error).__name__, outcome.value))
    if job.payload.get("inner_fails") == "after":
        raise ValueError("inner, after")


@tenants.handler("whose")
def whose(job: Job) -> dict[str, Any]:
    """The tenant the middleware set, and the job's meta."""
    SEEN.append(("handler", job.id))
    if job.payload.get("fail"):
        raise RuntimeError("the handler fails")
    return {"tenant": TENANT.get(), "meta": job.meta}


@tenants.handler("awhose")
async def awhose(job: Job) -> dict[str, Any]:
    await asyncio.sleep(0)
    SEEN.append(("handler", job.id))
    return {"tenant": TENANT.get(), "meta": job.meta}


@tenants.handler("sleeps", timeout=0.5)
def sleeps(job: Job) -> None:
    time.sleep(30)


# --- app: traced by jobsup.otel ------------------------------------------------------------------------

app = App()


@app.handler("ok")
def ok(job: Job) -> dict[str, Any]:
    return {"meta": job.meta}


@app.handler("aok")
async def aok(job: Job) -> str:
    await asyncio.sleep(0)
    return "async"


@app.handler("flaky", max_attempts=5)
def flaky(job: Job) -> int:
    """Fails its first `fails` attempts."""
    if job.attempts <= job.payload.get("fails", 0):
        raise ValueError(f"attempt {job.attempts} fails")
    return job.attempts


@app.handler("snoozy")
def snoozy(job: Job) -> str:
    if job.snoozes == 0:
        raise Snooze(0)
    return "woke"


@app.handler("stuck", timeout=0.5)
def stuck(job: Job) -> None:
    time.sleep(30)


# --- shared_app: jobs that share a worker process, each in its own trace ----------------------------

shared_app = App()


@shared_app.handler("shared_ok", shared=True)
async def shared_ok(job: Job) -> int:
    await asyncio.sleep(float(job.payload.get("seconds", 0.2)))
    return job.id


def span_record(span: Any) -> dict[str, Any]:
    """What a test reads of a finished span (an SDK ReadableSpan)."""
    context, parent = span.get_span_context(), span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes),
        "status": span.status.status_code.name,
        "description": span.status.description,
        "events": [{"name": e.name, "attributes": dict(e.attributes)} for e in span.events],
        "pid": os.getpid(),
        "start": span.start_time,
        "end": span.end_time,
    }


def _configure_tracing(directory: str, batch: bool) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class ToFile(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            with open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a") as out:
                for span in spans:
                    out.write(json.dumps(span_record(span)) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    if batch:  # as in production, but holding the spans until the worker ends (or a stop flushes them)
        provider.add_span_processor(BatchSpanProcessor(ToFile(), schedule_delay_millis=600_000))
    else:  # each span written as it ends
        provider.add_span_processor(SimpleSpanProcessor(ToFile()))
    trace.set_tracer_provider(provider)


if os.environ.get("TRACED_SPANS_DIR"):
    _configure_tracing(os.environ["TRACED_SPANS_DIR"], batch=bool(os.environ.get("TRACED_BATCH")))
