"""The supervisor's settings, with the defaults that `jobsup start --help` shows."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from jobsup.db.dsn import check, pooler
from jobsup.durations import format_duration
from jobsup.errors import BadInput
from jobsup.ops.prune import KEEP_DEAD, KEEP_DONE

# The shortest --lease: it is renewed every third of it, and each renewal must reach the database
# within that third, so the floor is a renewal every 100 ms. Below it, ordinary latency (a loaded
# server, a garbage collection, a busy loop) outlasts the lease between two renewals and the reaper
# takes back jobs their live supervisor holds (docs/design/architecture.md, invariant 5); a 1 ms lease
# lapses before its first renewal. Not tied to --heartbeat-interval: the heartbeat renews no lease.
LEASE_MIN = 0.3


@dataclass(frozen=True)
class Config:
    app: str = ""
    django: str = ""  # a Django settings module: workers run the project's tasks (jobsup.django)
    procs: int = min(8, os.cpu_count() or 2)
    queues: tuple[str, ...] = ("default",)
    # Jobs one worker process runs at once, of the handlers declared shared=True (tasks on its event loop,
    # or its threads); a job of any other handler runs alone in a process. Per process: the limits of
    # `jobsup limit KIND --concurrency` count across every supervisor instead.
    capacity: int = 100
    # A process whose event loop a shared job blocks (a sync call inside an async def) for longer than
    # this is recycled; the watchdog reports a block after a second.
    loop_block_limit: float = 10.0
    # Most jobs one claim statement takes. Under a deep backlog of short jobs the supervisor claims back
    # to back and its rate is about batch / claim time; a claim's cost is mostly per row, but its round
    # trip, plan and commit are not: 300 drained 100,000 no-op jobs ~30% faster than 100 here. The rate
    # also bounds it: a claim takes no more than the workers start within PREFETCH_HORIZON.
    batch: int = 300
    # Jobs claimed beyond idle workers: a worker that finishes gets its next job without a round trip.
    # Small, because a prefetched job waits; its lease is renewed with the running ones.
    prefetch: int = 2
    lease: float = 30.0  # seconds; renewed every lease/3, so two renewals may fail before it lapses
    timeout: float = 300.0  # a job's time limit when its handler sets none
    shutdown_timeout: float = 30.0
    reap_interval: float = 5.0
    poll_interval: float = 2.0  # safety net only: NOTIFY and known run_at times wake the dispatcher
    flush_interval: float = 0.002  # outcomes wait at most this long to share one write
    heartbeat_interval: float = 1.0
    max_jobs_per_proc: int = 0
    max_memory_mb: int = 0
    backoff_base: float = 1.0
    backoff_cap: float = 3600.0
    backoff_jitter: float = 0.1
    log_format: str = "text"
    log_level: str = "info"
    # How long a worker may take to import the app and say it is ready.
    start_timeout: float = 60.0
    # A worker asked to stop (timeout, shutdown) gets this long after SIGTERM before SIGKILL.
    kill_grace: float = 2.0
    keep_done: float = KEEP_DONE  # seconds a done job is kept; 0 keeps it forever
    keep_dead: float = KEEP_DEAD  # the same for dead and cancelled jobs
    prune_interval: float = 30.0  # between pruning rounds; a round goes on until nothing is left
    # "transaction": the DSN leads to a transaction pooler (PgBouncer pool_mode=transaction), so no
    # connection relies on its session; LISTEN then needs listen_dsn, or the claim loop polls.
    pooler: str = "none"
    listen_dsn: str = ""  # a direct connection for LISTEN when the DSN leads to a pooler
    metrics_port: int = 0  # serve /metrics and /healthz on this port (jobsup/supervisor/exporter.py); 0: off
    metrics_host: str = "localhost"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Config:
        queues = tuple(q.strip() for q in str(args.queues).split(",") if q.strip())
        config = cls(
            app=args.app or "",
            django=args.django or "",
            procs=int(args.procs),
            capacity=int(args.capacity),
            loop_block_limit=float(args.loop_block_limit),
            queues=queues,
            batch=int(args.batch),
            prefetch=int(args.prefetch),
            lease=float(args.lease),
            timeout=float(args.timeout),
            shutdown_timeout=float(args.shutdown_timeout),
            reap_interval=float(args.reap_interval),
            poll_interval=float(args.poll_interval),
            flush_interval=float(args.flush_interval),
            heartbeat_interval=float(args.heartbeat_interval),
            max_jobs_per_proc=int(args.max_jobs_per_proc),
            max_memory_mb=int(args.max_memory),
            backoff_base=float(args.backoff_base),
            backoff_cap=float(args.backoff_cap),
            backoff_jitter=float(args.backoff_jitter),
            log_format=args.log_format,
            log_level=args.log_level,
            keep_done=float(args.keep_done),
            keep_dead=float(args.keep_dead),
            prune_interval=float(args.prune_interval),
            pooler=args.pooler or "none",
            listen_dsn=args.listen_dsn or "",
            metrics_port=int(args.metrics_port),
            metrics_host=args.metrics_host or "localhost",
        )
        config.validate()
        return config

    def validate(self) -> None:
        from jobsup.app import split_target

        if self.app or not self.django:  # its form only; whether it imports, the workers find out
            split_target(self.app)
        if not self.queues:
            raise BadInput("--queues names no queue")
        if self.prefetch < 0 or self.max_jobs_per_proc < 0 or self.max_memory_mb < 0:
            raise BadInput("--prefetch, --max-jobs-per-proc and --max-memory cannot be negative")
        if self.capacity < 1:
            raise BadInput(f"--capacity must be a whole number of at least 1, not {self.capacity}")
        for name in (
            "timeout",
            "loop_block_limit",
            "reap_interval",
            "poll_interval",
            "heartbeat_interval",
            "prune_interval",
        ):
            if getattr(self, name) <= 0:
                raise BadInput(f"--{name.replace('_', '-')} must be more than 0")
        if self.lease < LEASE_MIN:  # 0 too: the floor is what the user needs to know
            raise BadInput(
                f"--lease must be at least {format_duration(LEASE_MIN)}, not {format_duration(self.lease)}: it is "
                f"renewed every third of it, and a shorter lease can lapse between two renewals"
            )
        if not 0 <= self.backoff_jitter <= 1:
            raise BadInput("--backoff-jitter is a fraction between 0 and 1")
        # argparse checks the choices of a flag, not of a JOBSUP_* variable standing in for it.
        if self.log_format not in ("text", "json"):
            raise BadInput(f"JOBSUP_LOG_FORMAT must be text or json, not {self.log_format!r}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise BadInput(f"JOBSUP_LOG_LEVEL must be debug, info, warning or error, not {self.log_level!r}")
        pooler(self.pooler)
        if self.listen_dsn:  # refused as bad input here, before a worker starts or a connection is tried
            try:
                check(self.listen_dsn)
            except BadInput as exc:
                raise BadInput(f"--listen-dsn: {exc}") from None
        if not 0 <= self.metrics_port <= 65535:
            raise BadInput(f"--metrics-port must be a TCP port from 1 to 65535 (0: off), not {self.metrics_port}")

    @property
    def pooled(self) -> bool:
        return self.pooler == "transaction"


DEFAULTS = Config()
