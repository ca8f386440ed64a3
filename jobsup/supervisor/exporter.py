"""The metrics duty: `/metrics` (Prometheus text format) and `/healthz` on --metrics-port.

The HTTP side is a few lines of asyncio in the supervisor's own loop, not prometheus-client's server
thread: the supervisor starts no thread (docs/design/architecture.md), a scrape reads the dispatcher's and the keeper's
figures without a lock, and /healthz answering at all says the loop is not stuck. The port is bound in
`bind`, before any worker starts, so a port in use is one line and exit 2 with nothing started.

Each scrape builds the figures from what the supervisor already counts (tally.py, the latency
Recorder's totals, the keeper's workers): the hot path pays for counting, never for exporting.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from jobsup.errors import BadInput
from jobsup.ops.latency import Histogram

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import HistogramMetricFamily

    from jobsup.supervisor.supervisor import Supervisor

# `le` bounds of every histogram: 1, 2.5 and 5 of each decade, each a bound of jobsup.ops.latency's fine
# buckets, so the counts below each are exact.
BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1000.0,
    2500.0,
    5000.0,
)
# A request must arrive whole within this long; a probe that sends nothing is cut off.
REQUEST_TIMEOUT = 5.0
# /healthz turns 503 when the last answer of the database (the heartbeat's) is older than this many
# heartbeat intervals, and at least this many seconds.
HEALTHY_BEATS = 3
HEALTHY_MIN = 5.0


def bind(host: str, port: int) -> socket.socket:
    """The listening socket of --metrics-host/--metrics-port, or BadInput saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise BadInput(f"--metrics-host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise BadInput(f"--metrics-port {port}: the port is in use on {host}") from None
        raise BadInput(f"--metrics-port {port} on {host}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def registry(sup: Supervisor) -> CollectorRegistry:
    """A private CollectorRegistry holding the supervisor's figures (never the process-wide one)."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(sup))
    return reg


def _histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    counts = h.cumulative(BUCKETS)
    family.add_metric(labels, [*((repr(b), n) for b, n in zip(BUCKETS, counts, strict=True)), ("+Inf", h.total)], h.sum)


class _Collector:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        sup = self.sup
        d = sup.dispatcher
        tally = sup.tally
        if d is None or tally is None:
            return
        jobs = CounterMetricFamily(
            "jobsup_jobs",
            "Jobs whose outcome this supervisor wrote, by kind and "
            "outcome (done, failed: to be retried, dead, released)",
            labels=["kind", "outcome"],
        )
        for (kind, outcome), n in sorted(tally.outcomes.items()):
            jobs.add_metric([kind, outcome], n)
        yield jobs
        for metric, name, text in (
            (
                "run_time",
                "jobsup_run_time_seconds",
                "Run time of finished attempts, from handing the job to a worker to its outcome",
            ),
            (
                "queue_latency",
                "jobsup_queue_latency_seconds",
                "Queue latency of finished attempts: started_at - run_at",
            ),
        ):
            family = HistogramMetricFamily(name, text, labels=["kind"])
            for (kind, m), h in d.latency().histograms().items():
                if m == metric:
                    _histogram(family, [kind], h)
            yield family
        workers = GaugeMetricFamily("jobsup_workers", "Worker processes by state", labels=["state"])
        states = {"starting": 0, "idle": 0, "busy": 0, "stopping": 0}
        for worker in sup.keeper.all_processes():
            states[worker.state] = states.get(worker.state, 0) + 1
        for state, n in states.items():
            workers.add_metric([state], n)
        yield workers
        restarts = CounterMetricFamily(
            "jobsup_worker_restarts", "Worker processes replaced, by cause", labels=["cause"]
        )
        for cause, n in sorted(sup.keeper.restarts_by_cause.items()):
            restarts.add_metric([cause], n)
        yield restarts
        rss = GaugeMetricFamily(
            "jobsup_worker_rss_bytes", "Resident memory of each worker, sampled with the heartbeat", labels=["slot"]
        )
        for worker in sup.keeper.workers.values():
            rss.add_metric([str(worker.slot)], worker.rss)
        yield rss
        shared = GaugeMetricFamily(
            "jobsup_worker_shared_jobs", "Jobs that share each worker process, running now", labels=["slot"]
        )
        lag = GaugeMetricFamily(
            "jobsup_worker_loop_lag_seconds",
            "How late the event loop of each worker running shared jobs came round at worst in the last second",
            labels=["slot"],
        )
        for worker in sup.keeper.workers.values():
            shared.add_metric([str(worker.slot)], len(worker.sharing))
            lag.add_metric([str(worker.slot)], worker.lag)
        yield shared
        yield lag
        yield GaugeMetricFamily(
            "jobsup_worker_capacity",
            "Jobs one worker process runs at once (--capacity), of shared handlers",
            value=sup.config.capacity,
        )
        yield CounterMetricFamily(
            "jobsup_worker_loop_blocked",
            "Times the event loop of a worker running shared jobs was found blocked (a sync call in an async handler)",
            value=sup.keeper.blocked_count,
        )
        yield CounterMetricFamily(
            "jobsup_jobs_reaped",
            "Jobs this supervisor's reaper returned to the queue or buried (their lease had expired)",
            value=tally.reaped,
        )
        yield CounterMetricFamily("jobsup_claimed_jobs", "Jobs the claim statements took", value=tally.claimed)
        for name, what, count, seconds in (
            ("claim", "Claim statements", tally.claims, tally.claim_seconds),
            ("outcome_write", "Outcome statements (done, failed, released)", tally.writes, tally.write_seconds),
        ):
            yield CounterMetricFamily(f"jobsup_{name}s", what, value=count)
            took = HistogramMetricFamily(
                f"jobsup_{name}_duration_seconds", f"{what}: the time of each, round trip included"
            )
            _histogram(took, [], seconds)
            yield took
        yield CounterMetricFamily("jobsup_notify_wakeups", "NOTIFYs that woke the claim loop", value=tally.wakeups)
        reconnects = CounterMetricFamily(
            "jobsup_db_reconnects",
            "Connections to the database opened again after one was lost, by the supervisor's link",
            labels=["link"],
        )
        for name, link in sorted(sup.links.items()):
            reconnects.add_metric([name], link.reconnects)
        yield reconnects
        healthy, _ = health(sup)
        yield GaugeMetricFamily("jobsup_healthy", "1 while /healthz answers 200", value=int(healthy))


def health(sup: Supervisor) -> tuple[bool, str]:
    """(healthy, why): the loops are running and the database answered the heartbeat lately."""
    if sup.signals or sup.fatal:
        return False, "stopping"
    failed = sup.duties.failed()
    if failed is not None:
        return False, f"the {failed[0]} loop failed"
    reached_db = sup.heartbeat.reached_db
    if reached_db is None:
        return False, "the database has not answered yet"
    age = asyncio.get_running_loop().time() - reached_db
    limit = max(HEALTHY_MIN, HEALTHY_BEATS * sup.config.heartbeat_interval)
    if age > limit:
        return False, f"the database has not answered for {age:.0f}s"
    return True, "ok"


class Exporter:
    """The metrics duty: serves the socket that `bind` opened until it is stopped."""

    name = "metrics"

    def __init__(self, sock: socket.socket, sup: Supervisor) -> None:
        self.sock = sock
        self.sup = sup

    async def run(self) -> None:
        await serve(self.sock, self.sup)


async def serve(sock: socket.socket, sup: Supervisor) -> None:
    """Answer /metrics and /healthz on `sock` until cancelled."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    reg = registry(sup)

    def metrics() -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, generate_latest(reg)

    def healthz() -> tuple[int, str, bytes]:
        ok, why = health(sup)
        return (200 if ok else 503), "text/plain; charset=utf-8", f"{why}\n".encode()

    routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {"/metrics": metrics, "/healthz": healthz}
    server = await asyncio.start_server(lambda r, w: _answer(r, w, routes), sock=sock)
    async with server:
        await server.serve_forever()


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


async def _answer(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, routes: dict[str, Callable[[], tuple[int, str, bytes]]]
) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
        method, _, rest = head.decode("latin-1").partition(" ")
        path = rest.split(" ", 1)[0].split("?", 1)[0]
        route = routes.get(path)
        if method not in ("GET", "HEAD"):
            status, kind, body = 405, "text/plain", b"GET only\n"
        elif route is None:
            status, kind, body = 404, "text/plain", b"/metrics or /healthz\n"
        else:
            status, kind, body = route()
        writer.write(
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        )
        if method != "HEAD":
            writer.write(body)
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()
