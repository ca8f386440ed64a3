"""Flags of `jobsup start`. The supervisor itself is imported only when the command runs."""

from __future__ import annotations

import argparse
import os

from .config import DEFAULTS, Config


def _env(name: str, default: object) -> object:
    return os.environ.get(f"JOBSUP_{name.upper()}", default)


def configure(parser: argparse.ArgumentParser) -> None:
    from ..cli import _duration, _positive_int

    d = DEFAULTS
    parser.description = ("Run the supervisor: it spawns --procs isolated worker processes, claims jobs in "
                          "batches, hands them to idle workers, writes outcomes back, renews leases and "
                          "runs the listener and the reaper. Every flag can also be set by the JOBSUP_* "
                          "variable named in its help.")
    parser.add_argument("--app", default=_env("app", None),
                        help="module:attribute of the jobsup App, e.g. examples.lab:app (env JOBSUP_APP)")
    parser.add_argument("--procs", type=_positive_int, default=_env("procs", d.procs),
                        help=f"worker processes (env JOBSUP_PROCS; default: the cores, at most 8; here {d.procs})")
    parser.add_argument("--queues", default=_env("queues", ",".join(d.queues)),
                        help="comma-separated queues to work (env JOBSUP_QUEUES; default default)")
    parser.add_argument("--batch", type=_positive_int, default=_env("batch", d.batch),
                        help=f"most jobs claimed in one statement (env JOBSUP_BATCH; default {d.batch})")
    parser.add_argument("--prefetch", type=int, default=_env("prefetch", d.prefetch),
                        help="jobs claimed beyond idle workers, so a finishing worker gets its next job "
                             "at once; with many short jobs it grows to what the workers finish in 50 ms "
                             f"(env JOBSUP_PREFETCH; default {d.prefetch})")
    parser.add_argument("--lease", type=_duration, default=_env("lease", d.lease),
                        help=f"lease of a held job, renewed every third of it (env JOBSUP_LEASE; default {d.lease:g}s)")
    parser.add_argument("--timeout", type=_duration, default=_env("timeout", d.timeout),
                        help="a job's time limit when its handler sets none; its worker is then "
                             f"terminated (env JOBSUP_TIMEOUT; default {d.timeout:g}s)")
    parser.add_argument("--shutdown-timeout", type=_duration, default=_env("shutdown_timeout", d.shutdown_timeout),
                        help="on SIGTERM or Ctrl-C, how long running jobs may finish "
                             f"(env JOBSUP_SHUTDOWN_TIMEOUT; default {d.shutdown_timeout:g}s)")
    parser.add_argument("--reap-interval", type=_duration, default=_env("reap_interval", d.reap_interval),
                        help=f"how often the reaper looks for expired leases (env JOBSUP_REAP_INTERVAL; "
                             f"default {d.reap_interval:g}s)")
    parser.add_argument("--poll-interval", type=_duration, default=_env("poll_interval", d.poll_interval),
                        help="the safety-net poll when no NOTIFY arrives (env JOBSUP_POLL_INTERVAL; "
                             f"default {d.poll_interval:g}s)")
    parser.add_argument("--flush-interval", type=_duration, default=_env("flush_interval", d.flush_interval),
                        help="how long outcomes wait to be written together (env JOBSUP_FLUSH_INTERVAL; "
                             f"default {d.flush_interval * 1000:g}ms)")
    parser.add_argument("--heartbeat-interval", type=_duration,
                        default=_env("heartbeat_interval", d.heartbeat_interval),
                        help=f"how often the supervisor's row is written (env JOBSUP_HEARTBEAT_INTERVAL; "
                             f"default {d.heartbeat_interval:g}s)")
    parser.add_argument("--max-jobs-per-proc", type=int, default=_env("max_jobs_per_proc", d.max_jobs_per_proc),
                        help="replace a worker after about this many jobs, 0 for never "
                             "(env JOBSUP_MAX_JOBS_PER_PROC; default 0)")
    parser.add_argument("--max-memory", type=int, default=_env("max_memory", d.max_memory_mb),
                        help="replace a worker between jobs once its RSS passes this many MB; one that "
                             "passes twice this during a job is killed, failing that attempt; 0 for never "
                             "(env JOBSUP_MAX_MEMORY; default 0)")
    parser.add_argument("--backoff-base", type=_duration, default=_env("backoff_base", d.backoff_base),
                        help="retry delay of the first failure, doubled on each next one "
                             f"(env JOBSUP_BACKOFF_BASE; default {d.backoff_base:g}s)")
    parser.add_argument("--backoff-cap", type=_duration, default=_env("backoff_cap", d.backoff_cap),
                        help=f"longest retry delay (env JOBSUP_BACKOFF_CAP; default {d.backoff_cap:g}s)")
    parser.add_argument("--backoff-jitter", type=float, default=_env("backoff_jitter", d.backoff_jitter),
                        help="fraction of a retry delay taken off at random (env JOBSUP_BACKOFF_JITTER; "
                             f"default {d.backoff_jitter:g})")
    parser.add_argument("--log-format", choices=["text", "json"], default=_env("log_format", "text"),
                        help="text for terminals, json (one object per line) for machines "
                             "(env JOBSUP_LOG_FORMAT; default text)")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        default=_env("log_level", "info"), help="(env JOBSUP_LOG_LEVEL; default info)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import BadInput

    if not args.app:
        raise BadInput("jobsup start needs --app module:attribute (or JOBSUP_APP)")
    config = Config.from_args(args)
    from .main import main

    return main(config, dsn=args.dsn, data_dir=args.data_dir)
