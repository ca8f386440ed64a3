"""The cost of middleware and tracing: no-op throughput beside the release before, and tracing's cost per job.

    .venv/bin/python -m benchmarks.bench_middleware [--dsn SERVER] [--pairs 5] [--procs 8]
        [--base /tmp/base22] [--only compare,tracing,micro] [--json PATH]

compare: the release before middleware (a checkout of it with its own .venv at --base, such as commit
    0d1f1c0 set up by `git clone -q . /tmp/base22 && git -C /tmp/base22 checkout -q 0d1f1c0 &&
    python3.11 -m venv /tmp/base22/.venv && /tmp/base22/.venv/bin/pip install -q -e '/tmp/base22[dev]'`)
    against this checkout, with no middleware and tracing off: each checkout's own
    `python -m benchmarks.bench_supervisor --only basic --runs 1` on the same server (each migrates a
    database of its own), in alternating pairs (the base first in odd pairs, this checkout first in even
    ones), so a machine whose load drifts weighs on both alike. Prints the median over the pairs of this
    checkout's no-op jobs/s over the base's (the target: within 2%), and of the supervisor's CPU per
    no-op job, which the load of the machine sways less.
tracing: in alternating pairs, a supervisor of this checkout as it is and one with JOBSUP_OTEL=1 whose
    workers' app module sets an SDK tracer provider with a batch span processor and an exporter that
    drops the spans (TracedApp below): the no-op throughput ratio and the wall time a job costs more.
micro: in this process, what tracing costs one job where it is paid: the enqueue inside an active span
    (a producer span, the context written to meta) and the worker's run of a no-op handler (a consumer
    span, its context extracted and attached), in µs, against the same calls with tracing off.

The machine is shared and noisy: read the pairs, not one figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg

from jobsup.db import embedded
from jobsup.ops import bench as benchmark
from jobsup.ops.bench_app import app as bench_app

# The app the supervisor of a traced run starts (--app): the benchmark's handlers, and the tracer
# provider an application would configure in its module, exporting nowhere.
TRACED_APP = "benchmarks.bench_middleware:traced_app"
# Jobs each micro-benchmark times, after as many unmeasured.
MICRO_JOBS = 20_000


def _configure_tracing() -> None:
    """An SDK tracer provider whose batch processor hands the spans to an exporter that drops them: what
    tracing costs the worker, without the cost of a collector."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


traced_app = bench_app
if os.environ.get("JOBSUP_OTEL") and os.environ.get("JOBSUP_BENCH_DSN"):  # a traced run's worker
    _configure_tracing()


# --- compare: this checkout against the release before ---------------------------------------------------


def bench_supervisor(checkout: Path, server: str, procs: int) -> dict[str, float]:
    """One run of `checkout`'s own bench_supervisor --only basic, with its own Python: its figures."""
    python = checkout / ".venv" / "bin" / "python"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        argv = [str(python), "-m", "benchmarks.bench_supervisor", "--only", "basic", "--runs", "1"]
        argv += ["--procs", str(procs), "--dsn", server, "--json", out.name]
        done = subprocess.run(argv, cwd=checkout, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench_supervisor of {checkout} failed:\n{done.stdout}\n{done.stderr}")
        return json.loads(Path(out.name).read_text())["median"]


def compare(server: str, base: Path, pairs: int, procs: int) -> dict:
    rows = []
    for number in range(1, pairs + 1):
        order = [("base", base), ("this", ROOT)] if number % 2 else [("this", ROOT), ("base", base)]
        figures = {name: bench_supervisor(checkout, server, procs) for name, checkout in order}
        this, before = figures["this"], figures["base"]
        row = {
            "noop_base": before["noop_jobs_per_s"],
            "noop_this": this["noop_jobs_per_s"],
            "noop_ratio": this["noop_jobs_per_s"] / before["noop_jobs_per_s"],
            "cpu_per_job_ratio": (this["supervisor_cpu_of_one_core"] / this["noop_jobs_per_s"])
            / (before["supervisor_cpu_of_one_core"] / before["noop_jobs_per_s"]),
            "sleep_1ms_ratio": this["sleep_1ms_jobs_per_s"] / before["sleep_1ms_jobs_per_s"],
            "pickup_p50_base_ms": before["pickup_p50_ms"],
            "pickup_p50_this_ms": this["pickup_p50_ms"],
        }
        rows.append(row)
        print(f"pair {number} ({order[0][0]} first): " + _format(row), flush=True)
    medians = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    print(
        f"\nthis checkout against {base} ({pairs} pairs, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}): "
        f"no-op jobs/s {medians['noop_this']:,.0f} against {medians['noop_base']:,.0f}, median ratio "
        f"{medians['noop_ratio']:.3f} (target >= 0.98); supervisor CPU per no-op job "
        f"{medians['cpu_per_job_ratio']:.3f}; 1 ms jobs {medians['sleep_1ms_ratio']:.3f}",
        flush=True,
    )
    return {"pairs": rows, "median": medians}


# --- tracing: the same supervisor with tracing on and off ---------------------------------------------


def tracing(server: str, pairs: int, procs: int) -> dict:
    from benchmarks.server import fresh_database
    from jobsup.db.migrate import migrate
    from jobsup.db.sql import STATEMENTS as SQL

    rows = []
    with fresh_database(server, "jobsup_bench_middleware") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            conn.execute(SQL["bench_pickup_table"])
        for number in range(1, pairs + 1):
            figures = {}
            for traced in (False, True) if number % 2 else (True, False):
                figures[traced] = benchmark.one_run(
                    dsn,
                    procs,
                    start_args=("--app", TRACED_APP),
                    env={"JOBSUP_OTEL": "1"} if traced else {"JOBSUP_OTEL": ""},
                    connect=lambda d: psycopg.connect(d, autocommit=True),
                )
            off, on = figures[False], figures[True]
            row = {
                "noop_off": off["noop_jobs_per_s"],
                "noop_on": on["noop_jobs_per_s"],
                "noop_ratio": on["noop_jobs_per_s"] / off["noop_jobs_per_s"],
                "us_per_job_more": 1e6 * (1 / on["noop_jobs_per_s"] - 1 / off["noop_jobs_per_s"]),
                "sleep_1ms_ratio": on["sleep_1ms_jobs_per_s"] / off["sleep_1ms_jobs_per_s"],
                "pickup_p50_off_ms": off["pickup_p50_ms"],
                "pickup_p50_on_ms": on["pickup_p50_ms"],
            }
            rows.append(row)
            print(f"pair {number}: " + _format(row), flush=True)
    medians = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    print(
        f"\ntracing on (SDK provider, batch processor, spans dropped) against off, --procs {procs} "
        f"({pairs} pairs): no-op jobs/s {medians['noop_on']:,.0f} against {medians['noop_off']:,.0f}, ratio "
        f"{medians['noop_ratio']:.3f}, {medians['us_per_job_more']:.1f} µs of wall time more per job; "
        f"1 ms jobs {medians['sleep_1ms_ratio']:.3f}",
        flush=True,
    )
    return {"pairs": rows, "median": medians}


# --- micro: where tracing's cost is paid ------------------------------------------------------------------


def micro(server: str) -> dict[str, float]:
    """µs per job of the enqueue (inside an active span) and of the worker's run, tracing off then on."""
    from benchmarks.server import fresh_database
    from jobsup import otel
    from jobsup.db.migrate import migrate
    from jobsup.job import Job
    from jobsup.worker.runner import Runner

    _configure_tracing()
    from opentelemetry import trace

    tracer = trace.get_tracer("bench")
    job = Job(1, "noop", {}, "default", 1, 3)
    figures: dict[str, float] = {}
    with fresh_database(server, "jobsup_bench_middleware_micro") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            for state in ("off", "on"):
                if state == "on":
                    otel.instrument()
                run = Runner(bench_app).run
                figures[f"run_{state}_us"] = _timed(partial(run, job))
                enqueue = partial(bench_app.enqueue, conn, "noop")
                with tracer.start_as_current_span("request"):
                    # In a transaction rolled back at the end, so the table stays as it was.
                    with conn.transaction(force_rollback=True):
                        figures[f"enqueue_{state}_us"] = _timed(enqueue, MICRO_JOBS // 4)
    otel.uninstrument()
    figures["run_more_us"] = figures["run_on_us"] - figures["run_off_us"]
    figures["enqueue_more_us"] = figures["enqueue_on_us"] - figures["enqueue_off_us"]
    print(
        f"\ntracing's cost per job, in this process: the worker's run of a no-op handler "
        f"{figures['run_off_us']:.1f} -> {figures['run_on_us']:.1f} µs (+{figures['run_more_us']:.1f}); "
        f"an enqueue in a span {figures['enqueue_off_us']:.1f} -> {figures['enqueue_on_us']:.1f} µs "
        f"(+{figures['enqueue_more_us']:.1f}, the round trip included)",
        flush=True,
    )
    return figures


def _timed(call, count: int = MICRO_JOBS) -> float:
    for _ in range(count // 10):  # warm up
        call()
    started = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - started) / count * 1e6


def _format(row: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in row.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: an embedded one in a temporary directory)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--base", default="/tmp/base22", help="checkout of the release before, with its .venv")
    parser.add_argument("--only", default="compare,tracing,micro", help="subset of compare,tracing,micro")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    only = set(args.only.split(","))
    base = Path(args.base)
    if "compare" in only and not (base / ".venv" / "bin" / "python").exists():
        raise SystemExit(f"no checkout with a .venv at {base}: see this module's docstring")
    tmp = None if args.dsn else Path(tempfile.mkdtemp(prefix="jobsup-bench-middleware-"))
    report: dict = {}
    try:
        server = args.dsn or embedded.ensure_running(tmp / "pgdata")  # type: ignore[operator]
        if "compare" in only:
            report["compare"] = compare(server, base, args.pairs, args.procs)
        if "tracing" in only:
            report["tracing"] = tracing(server, args.pairs, args.procs)
        if "micro" in only:
            report["micro"] = micro(server)
    finally:
        if tmp is not None:
            embedded.stop(tmp / "pgdata")
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
