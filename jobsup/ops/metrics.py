"""`jobsup metrics`: the queue-wide gauges, served once for the whole queue.

Every supervisor exports what it does itself (jobsup/supervisor/exporter.py); what the queue holds
(jobs waiting for their parents, ready, scheduled, running and dead by queue and kind, the oldest
ready job per queue, for each kind with a limit the jobs held against it and those it throttles, and the
workflows open, done and failed) is the same whichever supervisor reads it, so one small process reads
it at each scrape and serves it, and adding supervisors adds no duplicate series and no load. Each
scrape reads the partial indexes of live and dead jobs, never the finished ones, and the workflows
table (a row per workflow that retention keeps).
"""

from __future__ import annotations

import errno
import signal
import sys
import threading
import time
from collections.abc import Iterator

import psycopg
from psycopg.rows import dict_row

from jobsup.db import dsn as dsns
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import BadInput, first_line
from jobsup.ops.snapshot import THROTTLED_COUNTED, LimitedKind, limited_kinds

# The status label of jobsup_queue_jobs; all but dead are columns of live_counts (snapshot.sql).
STATUSES = ("waiting", "ready", "scheduled", "running", "dead")
LIVE_STATUSES = STATUSES[:-1]
# The status label of jobsup_workflows: the columns of workflow_counts.
WORKFLOW_STATUSES = ("open", "done", "failed")


class QueueCollector:
    """Reads the queue's figures at each scrape over one connection, opened again when it breaks."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection | None = None
        self.lock = threading.Lock()  # the HTTP server may answer two scrapes at once
        self.last_error: str | None = None  # while the database does not answer

    def _rows(self) -> tuple[list[dict], list[dict], list[dict], list[dict], list[dict]]:
        if self.conn is None or self.conn.closed:
            self.conn = dsns.connect(self.dsn)
        with self.conn.cursor(row_factory=dict_row) as cur:
            results = []
            for name, params in (
                ("live_counts", {}),
                ("exporter_dead", {}),
                ("oldest_ready", {}),
                ("limited_kinds", {"counted": THROTTLED_COUNTED + 1}),
                ("workflow_counts", {}),
            ):
                cur.execute(SQL[name], params)
                results.append(cur.fetchall())
        return results[0], results[1], results[2], results[3], results[4]

    def collect(self) -> Iterator:
        from prometheus_client.core import GaugeMetricFamily

        started = time.perf_counter()
        up = GaugeMetricFamily("jobsup_database_up", "1 when this scrape read the queue's figures")
        try:
            with self.lock:
                live, dead, oldest, limited, workflows = self._rows()
            if self.last_error is not None:
                print("jobsup metrics: the database answers again", file=sys.stderr, flush=True)
            self.last_error = None
        except Exception as exc:  # psycopg's, or DatabaseUnavailable: the scrape reports the outage
            conn, self.conn = self.conn, None
            if conn is not None:
                try:
                    conn.close()
                except psycopg.Error:
                    pass
            if self.last_error is None:  # once per outage, not once per scrape
                print(
                    f"jobsup metrics: the database did not answer: {dsns.redact(first_line(exc))}",
                    file=sys.stderr,
                    flush=True,
                )
            self.last_error = first_line(exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily(
            "jobsup_queue_jobs",
            "Jobs in the queue now, by queue, kind and status (waiting: for their parents to finish; ready: "
            "runnable now; scheduled: run_at in the future)",
            labels=["queue", "kind", "status"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        for row in live:
            for status in LIVE_STATUSES:
                key = (row["queue"], row["kind"], status)
                counts[key] = counts.get(key, 0) + row[status]
        for row in dead:
            counts[(row["queue"], row["kind"], "dead")] = row["dead"]
        for (queue, kind, status), n in sorted(counts.items()):
            jobs.add_metric([queue, kind, status], n)
        yield jobs
        age = GaugeMetricFamily(
            "jobsup_oldest_ready_age_seconds",
            "Age of the oldest ready job of each queue (its run_at to now); absent for a queue with none",
            labels=["queue"],
        )
        for row in oldest:
            age.add_metric([row["queue"]], row["age"])
        yield age
        yield from limit_gauges(limited_kinds(limited))
        flows = GaugeMetricFamily(
            "jobsup_workflows",
            "Workflows by status: open (a job of theirs has not finished), done (all their jobs done) and "
            "failed (one ended dead or cancelled); finished ones for as long as retention keeps them",
            labels=["status"],
        )
        for status in WORKFLOW_STATUSES:
            flows.add_metric([status], workflows[0][status])
        yield flows
        yield GaugeMetricFamily(
            "jobsup_exporter_scrape_seconds",
            "Time this scrape took to read the figures",
            value=time.perf_counter() - started,
        )


def limit_gauges(kinds: list[LimitedKind]) -> Iterator:
    """The gauges of the kinds with a limit in force, labelled by kind: what they hold, their limits, what
    they throttle and for how long. A kind without a given limit has no sample of its gauge."""
    from prometheus_client.core import GaugeMetricFamily

    held = GaugeMetricFamily(
        "jobsup_limit_held_jobs",
        "Jobs of a limited kind held against its limits now (running)",
        labels=["kind"],
    )
    concurrency = GaugeMetricFamily(
        "jobsup_limit_concurrency",
        "The concurrency limit of a kind: at most this many of its jobs held at once",
        labels=["kind"],
    )
    rate = GaugeMetricFamily(
        "jobsup_limit_rate_per_second",
        "The rate limit of a kind, in starts per second",
        labels=["kind"],
    )
    throttled = GaugeMetricFamily(
        "jobsup_limit_throttled_jobs",
        f"Ready jobs of a limited kind held back by its limits (throttled), counted up to {THROTTLED_COUNTED:,}",
        labels=["kind"],
    )
    startable = GaugeMetricFamily(
        "jobsup_limit_startable_jobs",
        "Ready jobs of a limited kind that its limits allow to start now: they wait for a free worker, "
        f"not for a limit; counted up to {THROTTLED_COUNTED:,}",
        labels=["kind"],
    )
    throttled_age = GaugeMetricFamily(
        "jobsup_limit_throttled_age_seconds",
        "How long the oldest throttled job of a limited kind has waited (from its run_at); "
        "absent for a kind with none throttled",
        labels=["kind"],
    )
    for k in kinds:
        held.add_metric([k.kind], k.held)
        throttled.add_metric([k.kind], k.throttled)
        startable.add_metric([k.kind], k.startable)
        if k.limits.concurrency is not None:
            concurrency.add_metric([k.kind], k.limits.concurrency)
        if k.limits.rate is not None:
            rate.add_metric([k.kind], k.limits.rate.count / k.limits.rate.period)
        if k.throttled_age is not None:
            throttled_age.add_metric([k.kind], k.throttled_age)
    yield from (held, concurrency, rate, throttled, startable, throttled_age)


def serve(dsn: str, host: str, port: int, ready: threading.Event | None = None) -> None:
    """Serve /metrics on host:port until SIGTERM or Ctrl-C."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(dsn))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        what = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise BadInput(f"--port {port}: {what} on {host}") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    print(f"serving the queue's metrics on http://{host}:{port}/metrics (Ctrl-C stops)", flush=True)
    if ready is not None:
        ready.set()
    stop.wait()
    server.shutdown()
    thread.join(5)
