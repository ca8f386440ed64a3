"""Tracing with OpenTelemetry (jobsup.otel): in this process through jobsup.testing.drain, with the SDK's
in-memory exporter; then through a real `jobsup start`, whose workers configure their tracer provider in
the app's module (tests/apps/traced.py) and write their finished spans to files the test reads; and
from a Django view through the django.tasks backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

opentelemetry = pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

import jobsup  # noqa: E402
from jobsup import client, otel  # noqa: E402
from jobsup.testing import drain  # noqa: E402

from .apps.traced import app, span_record  # noqa: E402
from .helpers import ROOT, cli_env, wait_for  # noqa: E402
from .test_django import django_db, start_django  # noqa: E402, F401 (the Django tests' fixtures)

APP = "tests.apps.traced:app"


@pytest.fixture(scope="module")
def memory() -> InMemorySpanExporter:
    """This process's tracer provider (set once: OpenTelemetry refuses a second), exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@pytest.fixture
def spans(memory: InMemorySpanExporter):
    """Tracing on in this process: spans() is what has ended since, as span_record()s, oldest first."""
    otel.instrument()
    memory.clear()
    yield lambda: [span_record(s) for s in memory.get_finished_spans()]
    otel.uninstrument()


tracer = trace.get_tracer("tests")


def by_name(records: list[dict], name: str) -> list[dict]:
    return [r for r in records if r["name"] == name]


def assert_process_span(span: dict, job_id: int, kind: str, attempt: int, max_attempts: int) -> None:
    assert span["name"] == f"process {kind}"
    assert span["kind"] == "CONSUMER"
    assert span["attributes"] == {
        "messaging.system": "jobsup",
        "messaging.destination.name": "default",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": str(job_id),
        "jobsup.kind": kind,
        "jobsup.attempt": attempt,
        "jobsup.max_attempts": max_attempts,
        "jobsup.outcome": span["attributes"]["jobsup.outcome"],
        # On a failed attempt only (the messaging conventions require it there); each test says which.
        **({"error.type": span["attributes"]["error.type"]} if "error.type" in span["attributes"] else {}),
    }


# --- in this process -----------------------------------------------------------------------------------


def test_a_job_enqueued_in_a_span_runs_in_a_child_span_of_its_enqueue(conn, spans):
    with tracer.start_as_current_span("request") as request:
        job_id = app.enqueue(conn, "ok")
    [ran] = drain(app, conn)
    request_span, send, process = (by_name(spans(), n)[0] for n in ("request", "send ok", "process ok"))
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert {request_span["trace_id"], send["trace_id"], process["trace_id"]} == {trace_id}
    # The producer span is the request's child, and the job's creation context: the attempt's parent,
    # and linked, as the messaging conventions ask.
    assert send["kind"] == "PRODUCER" and send["parent_id"] == request_span["span_id"]
    assert send["attributes"] == {
        "messaging.system": "jobsup",
        "messaging.destination.name": "default",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "jobsup.kind": "ok",
    }
    assert process["parent_id"] == send["span_id"] and process["links"] == [send["span_id"]]
    assert_process_span(process, job_id, "ok", 1, 3)
    assert (process["attributes"]["jobsup.outcome"], process["status"]) == ("done", "UNSET")
    # What the handler saw, and what the row holds: the producer span's context.
    [meta] = conn.execute("SELECT meta FROM jobsup.jobs").fetchone()
    assert ran.return_value == {"meta": meta}
    assert list(meta) == ["traceparent"] and meta["traceparent"].startswith(f"00-{trace_id}-{send['span_id']}-")


def test_a_job_that_fails_twice_then_succeeds_has_three_spans_in_its_trace(conn, spans):
    with tracer.start_as_current_span("request"):
        job_id = app.enqueue(conn, "flaky", {"fails": 2})
    runs = drain(app, conn, with_scheduled=True, backoff_base=0.001)
    assert [r.outcome for r in runs] == ["failed", "failed", "done"]
    [send] = by_name(spans(), "send flaky")
    attempts = by_name(spans(), "process flaky")
    assert [s["attributes"]["jobsup.attempt"] for s in attempts] == [1, 2, 3]
    assert {s["trace_id"] for s in attempts} == {send["trace_id"]}
    assert {s["parent_id"] for s in attempts} == {send["span_id"]}  # each retry a new span, same parent
    for span in attempts:
        assert_process_span(span, job_id, "flaky", span["attributes"]["jobsup.attempt"], 5)
    for n, span in enumerate(attempts[:2], 1):
        assert (span["status"], span["description"]) == ("ERROR", f"ValueError: attempt {n} fails")
        [event] = span["events"]
        assert event["name"] == "exception"
        assert event["attributes"]["exception.type"] == "ValueError"
        assert event["attributes"]["exception.message"] == f"attempt {n} fails"
        assert span["attributes"]["jobsup.outcome"] == "failed"
        assert span["attributes"]["error.type"] == "ValueError"  # the conventions': required on a failure
    assert (attempts[2]["status"], attempts[2]["events"], attempts[2]["attributes"]["jobsup.outcome"]) == (
        "UNSET",
        [],
        "done",
    )
    assert "error.type" not in attempts[2]["attributes"]  # and only there


def test_a_snoozed_attempt_is_marked_as_such_and_is_no_error(conn, spans):
    with tracer.start_as_current_span("request"):
        app.enqueue(conn, "snoozy")
    assert [r.outcome for r in drain(app, conn)] == ["snoozed", "done"]
    snoozed, woke = by_name(spans(), "process snoozy")
    assert snoozed["attributes"]["jobsup.outcome"] == "snoozed" and snoozed["status"] == "UNSET"
    assert snoozed["events"] == [{"name": "jobsup.snoozed", "attributes": {"jobsup.reason": "snoozed for 0s"}}]
    assert snoozed["attributes"]["jobsup.attempt"] == woke["attributes"]["jobsup.attempt"] == 1  # given back
    assert woke["attributes"]["jobsup.outcome"] == "done"
    assert "error.type" not in snoozed["attributes"]


def test_async_handlers_run_in_their_span(conn, spans):
    with tracer.start_as_current_span("request"):
        app.enqueue(conn, "aok")
    drain(app, conn)
    [send], [process] = by_name(spans(), "send aok"), by_name(spans(), "process aok")
    assert process["parent_id"] == send["span_id"] and process["attributes"]["jobsup.outcome"] == "done"


def test_outside_a_span_nothing_is_stored_and_each_attempt_starts_a_trace_of_its_own(conn, spans):
    job_id = jobsup.enqueue(conn, "ok")
    [ran] = drain(app, conn)
    assert ran.return_value == {"meta": None}
    assert conn.execute("SELECT meta FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone()[0] is None
    [process] = spans()  # no producer span
    assert process["name"] == "process ok" and process["parent_id"] is None and process["links"] == []


def test_every_enqueue_of_the_process_is_traced_with_or_without_an_app(conn, spans):
    with tracer.start_as_current_span("request"):
        jobsup.enqueue(conn, "ok")
        jobsup.enqueue_many(conn, [{"kind": "ok"}, {"kind": "ok"}])
        workflow = jobsup.Workflow()
        workflow.add("ok")
        workflow.enqueue(conn)
    sends = by_name(spans(), "send ok")
    metas = [r[0] for r in conn.execute("SELECT meta FROM jobsup.jobs ORDER BY id")]
    assert [m["traceparent"].split("-")[2] for m in metas] == [s["span_id"] for s in sends]
    assert len(sends) == 4


def test_with_tracing_off_nothing_is_traced_and_opentelemetry_is_not_imported(dsn):
    script = f"""
import sys, psycopg, jobsup
from jobsup.testing import drain
from tests.apps.traced import app
with psycopg.connect({dsn!r}, autocommit=True) as conn:
    conn.execute("DELETE FROM jobsup.jobs")
    app.enqueue(conn, "ok")
    jobsup.enqueue(conn, "ok")
    runs = drain(app, conn)
    metas = [r[0] for r in conn.execute("SELECT meta FROM jobsup.jobs")]
print(sorted({{m.split(".")[0] for m in sys.modules if m.startswith("opentelemetry")}}), metas, len(runs))
"""

    def run(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=cli_env(**env), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "[] [None, None] 2"
    # Turned on, without a tracer provider: imported, and still nothing stored (no span is active).
    assert run(JOBSUP_OTEL="1") == "['opentelemetry'] [None, None] 2"


# --- through a real supervisor -------------------------------------------------------------------------


def worker_spans(directory: Path) -> list[dict]:
    """The spans the workers wrote, each process to a file of its own, in the order they started."""
    lines = [json.loads(line) for path in directory.glob("*.jsonl") for line in path.read_text().splitlines()]
    return sorted(lines, key=lambda span: span["start"])


def finished(conn: psycopg.Connection, count: int) -> bool:
    query = "SELECT count(*) FROM jobsup.jobs WHERE status IN ('done', 'dead', 'cancelled')"
    return conn.execute(query).fetchone()[0] == count


def log_lines(log: str, action: str) -> list[dict]:
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [line for line in lines if line["action"] == action]


@pytest.mark.slow
def test_a_real_supervisors_workers_continue_the_enqueuers_trace(conn, start, spans, tmp_path):
    with tracer.start_as_current_span("request") as request:
        flaky = app.enqueue(conn, "flaky", {"fails": 2})
        app.enqueue(conn, "snoozy")
        stuck = app.enqueue(conn, "stuck", max_attempts=1)  # its handler's timeout is 0.5 s
    trace_id = f"{request.get_span_context().trace_id:032x}"
    sends = {s["name"]: s for s in spans() if s["kind"] == "PRODUCER"}
    sup = start("--log-format", "json", app=APP, env={"JOBSUP_OTEL": "1", "TRACED_SPANS_DIR": str(tmp_path)})
    wait_for(lambda: finished(conn, 3), 60, 0.05, "the jobs to finish")
    wait_for(lambda: len(worker_spans(tmp_path)) == 6, 10, 0.05, "the workers' spans")
    recorded = worker_spans(tmp_path)
    assert {s["trace_id"] for s in recorded} == {trace_id}
    for span in recorded:
        assert span["kind"] == SpanKind.CONSUMER.name
        assert span["parent_id"] == sends[span["name"].replace("process", "send")]["span_id"]

    attempts = by_name(recorded, "process flaky")
    assert [(s["attributes"]["jobsup.attempt"], s["status"]) for s in attempts] == [
        (1, "ERROR"),
        (2, "ERROR"),
        (3, "UNSET"),
    ]
    assert [e["attributes"]["exception.message"] for s in attempts[:2] for e in s["events"]] == [
        "attempt 1 fails",
        "attempt 2 fails",
    ]
    assert [s["attributes"]["jobsup.outcome"] for s in by_name(recorded, "process snoozy")] == ["snoozed", "done"]
    # A timeout stops the worker (SIGTERM): it leaves the attempt's middleware first, so the span ends,
    # timed out, and is exported before the worker does.
    [timed_out] = by_name(recorded, "process stuck")
    assert timed_out["attributes"]["jobsup.outcome"] == "timed_out"
    assert (timed_out["status"], timed_out["description"]) == ("ERROR", "AttemptStopped: timed out after 0.5s")
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", [stuck]).fetchone()[0] == "dead"

    # The supervisor's log lines of a job carry its trace, and the span of the attempt its worker ran.
    # job.dead is written after the outcome's commit, which the status above may have been read before.
    log = sup.wait_log('"job.dead"')
    failed = log_lines(log, "job.failed")
    assert [(line["job"], line["trace_id"], line["span_id"]) for line in failed] == [
        (flaky, trace_id, s["span_id"]) for s in attempts[:2]
    ]
    [timeout_line] = log_lines(log, "job.timed_out")
    assert (timeout_line["job"], timeout_line["trace_id"]) == (stuck, trace_id)
    [dead] = log_lines(log, "job.dead")
    assert (dead["job"], dead["trace_id"]) == (stuck, trace_id) and "span_id" not in dead


@pytest.mark.slow
def test_shared_jobs_in_one_process_each_continue_their_own_enqueuers_trace(conn, start, spans, tmp_path):
    """200 jobs, each enqueued in a request span of its own, run at once in one worker process: each
    has its consumer span in its own enqueuer's trace, a child of its own send span; none is attached
    to a neighbour's (the context is per task, not per process)."""
    trace_of: dict[int, str] = {}
    for _ in range(200):
        with tracer.start_as_current_span("request") as request:
            job_id = client.enqueue(conn, "shared_ok", {"seconds": 0.5})
        trace_of[job_id] = f"{request.get_span_context().trace_id:032x}"
    sends = {s["trace_id"]: s for s in spans() if s["kind"] == "PRODUCER"}  # one a trace
    start(
        "--capacity",
        "300",
        app="tests.apps.traced:shared_app",
        procs=1,
        env={"JOBSUP_OTEL": "1", "TRACED_SPANS_DIR": str(tmp_path)},
    )
    wait_for(lambda: finished(conn, 200), 60, 0.05, "the jobs to finish")
    wait_for(lambda: len(worker_spans(tmp_path)) == 200, 10, 0.05, "the workers' spans")
    recorded = worker_spans(tmp_path)
    assert len({s["pid"] for s in recorded}) == 1
    for span in recorded:
        job_id = int(span["attributes"]["messaging.message.id"])
        assert span["kind"] == SpanKind.CONSUMER.name
        assert span["trace_id"] == trace_of[job_id], job_id
        assert span["parent_id"] == sends[trace_of[job_id]]["span_id"], job_id
    # They did share the process: most of the 200 spans were open at one instant.
    edges = sorted([(s["start"], 1) for s in recorded] + [(s["end"], -1) for s in recorded])
    open_now = most = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    assert most >= 100, most


@pytest.mark.slow
def test_a_worker_exports_what_its_batch_processor_holds_when_it_ends_or_is_stopped(conn, start, spans, tmp_path):
    """Spans wait in a worker's batch processor (here for 10 minutes). A worker stopped mid-attempt
    (SIGTERM) exports them before it ends; one that ends between jobs exports them too, though it ends
    through multiprocessing, which runs no atexit handler (where the SDK would)."""
    with tracer.start_as_current_span("request"):
        app.enqueue(conn, "ok")
        app.enqueue(conn, "stuck", max_attempts=1)
    env = {"JOBSUP_OTEL": "1", "TRACED_SPANS_DIR": str(tmp_path), "TRACED_BATCH": "1"}
    sup = start(app=APP, procs=1, env=env)
    wait_for(lambda: finished(conn, 2), 60, 0.05, "the jobs to finish")
    stopped = wait_for(lambda: len(worker_spans(tmp_path)) == 2 and worker_spans(tmp_path), 10, 0.05, "spans")
    assert [s["name"] for s in stopped] == ["process ok", "process stuck"]
    assert stopped[1]["attributes"]["jobsup.outcome"] == "timed_out"
    assert stopped[1]["attributes"]["error.type"] == "timeout" and "error.type" not in stopped[0]["attributes"]

    with tracer.start_as_current_span("request"):
        later = app.enqueue(conn, "ok")  # run by the worker that replaced the stopped one
    wait_for(lambda: finished(conn, 3), 30, 0.05, "the job to finish")
    assert len(worker_spans(tmp_path)) == 2  # its span waits in the batch processor
    assert sup.stop() == 0
    assert [s["attributes"]["messaging.message.id"] for s in worker_spans(tmp_path)][2:] == [str(later)]


# --- from a Django view --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_django_view_that_enqueues_in_a_request_span_yields_one_trace_through_the_worker(
    django_db,  # noqa: F811 (the fixture imported above)
    conn,
    start_django,  # noqa: F811
    spans,
    tmp_path,
):
    from django.http import JsonResponse
    from django.test import RequestFactory

    from tests.django_project.tasks import add

    def signup(request):  # a view, as an application writes one
        result = add.enqueue(2, 3)
        return JsonResponse({"task": result.id})

    with tracer.start_as_current_span("GET /signup", kind=SpanKind.SERVER) as request:
        response = signup(RequestFactory().get("/signup"))
    task_id = int(json.loads(response.content)["task"])
    trace_id = f"{request.get_span_context().trace_id:032x}"
    [send] = by_name(spans(), "send tests.django_project.tasks.add")
    assert (send["trace_id"], send["parent_id"]) == (trace_id, f"{request.get_span_context().span_id:016x}")

    start_django(app=APP, env={"JOBSUP_OTEL": "1", "TRACED_SPANS_DIR": str(tmp_path)})
    wait_for(lambda: finished(conn, 1), 60, 0.05, "the task to finish")
    [process] = wait_for(lambda: worker_spans(tmp_path), 10, 0.05, "the worker's span")
    assert (process["name"], process["trace_id"], process["parent_id"]) == (
        "process tests.django_project.tasks.add",
        trace_id,
        send["span_id"],
    )
    assert_process_span(process, task_id, "tests.django_project.tasks.add", 1, 2)
    assert process["attributes"]["jobsup.outcome"] == "done"
