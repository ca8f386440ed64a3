"""Flags of `jobsup start`. The supervisor itself is imported only when the command runs."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from jobsup.durations import format_duration
from jobsup.supervisor.config import DEFAULTS, LEASE_MIN, Config

# Every flag of `jobsup start`: (flag, kind, what it does, choices). Each also comes from the variable
# JOBSUP_<NAME>, and its help names that variable and the default, so the two cannot drift apart.
# Kinds: "int" (at least 1), "count" (0 or more), "duration", "fraction", "text".
FLAGS: list[tuple[str, str, str, tuple[str, ...] | None]] = [
    ("--app", "text", "module:attribute of the jobsup App, e.g. examples.lab:app", None),
    (
        "--django",
        "text",
        "a Django settings module, e.g. mysite.settings: workers set up Django and run "
        "the project's tasks (with or without --app)",
        None,
    ),
    ("--procs", "int", "worker processes; by default the cores, at most 8", None),
    (
        "--capacity",
        "int",
        "jobs one worker process runs at once, of handlers declared shared=True (async ones as tasks, "
        "sync ones in threads); every other job runs alone in a process. Per process, unlike "
        "`jobsup limit --concurrency`, which counts across every supervisor",
        None,
    ),
    ("--queues", "text", "comma-separated queues to work", None),
    ("--batch", "int", "most jobs claimed in one statement", None),
    (
        "--prefetch",
        "count",
        "jobs claimed beyond idle workers, so a finishing worker gets its next job at "
        "once; with many short jobs it grows to what the workers finish in 50 ms",
        None,
    ),
    (
        "--lease",
        "duration",
        f"lease of a held job, renewed every third of it; at least {format_duration(LEASE_MIN)}",
        None,
    ),
    ("--timeout", "duration", "a job's time limit when its handler sets none; its worker is then terminated", None),
    (
        "--loop-block-limit",
        "duration",
        "recycle a worker whose event loop a shared job blocks for longer than this (reported after 1s)",
        None,
    ),
    ("--shutdown-timeout", "duration", "on SIGTERM, SIGHUP or Ctrl-C, how long running jobs may finish", None),
    ("--reap-interval", "duration", "how often the reaper looks for expired leases", None),
    ("--poll-interval", "duration", "the safety-net poll when no NOTIFY arrives", None),
    ("--flush-interval", "duration", "how long outcomes wait to be written together", None),
    ("--heartbeat-interval", "duration", "how often the supervisor's row is written", None),
    ("--max-jobs-per-proc", "count", "replace a worker after about this many jobs, 0 for never", None),
    (
        "--max-memory",
        "count",
        "replace a worker between jobs once its RSS passes this many MB; one that "
        "passes twice this during a job is killed, failing that attempt; 0 for never",
        None,
    ),
    ("--backoff-base", "duration", "retry delay of the first failure, doubled on each next one", None),
    ("--backoff-cap", "duration", "longest retry delay", None),
    ("--backoff-jitter", "fraction", "fraction of a retry delay taken off at random", None),
    ("--keep-done", "duration", "keep done jobs this long, then delete them; 0 keeps them forever", None),
    ("--keep-dead", "duration", "keep dead and cancelled jobs this long; 0 keeps them forever", None),
    ("--prune-interval", "duration", "how often one of the supervisors deletes jobs past their window", None),
    ("--log-format", "text", "text for terminals, json (one object per line) for machines", ("text", "json")),
    ("--log-level", "text", "how much to log", ("debug", "info", "warning", "error")),
    (
        "--pooler",
        "text",
        "what the DSN leads to: none (PostgreSQL itself) or transaction (a pooler in "
        "transaction mode, such as PgBouncer's: no prepared statements, no session state, "
        "LISTEN only through --listen-dsn)",
        ("none", "transaction"),
    ),
    (
        "--listen-dsn",
        "text",
        "with --pooler transaction: a direct connection to PostgreSQL for LISTEN; "
        "without one, the supervisor polls every 200 ms instead",
        None,
    ),
    (
        "--metrics-port",
        "count",
        "serve Prometheus metrics on /metrics and a health probe on /healthz at this TCP port; 0 for none",
        None,
    ),
    ("--metrics-host", "text", "the address --metrics-port listens on (0.0.0.0: every interface)", None),
]

# Flags whose Config field has another name.
_FIELD = {"max_memory": "max_memory_mb"}


def _shown(kind: str, value: object) -> str:
    """A default as --help shows it.

    >>> _shown("duration", 0.002), _shown("duration", 30.0), _shown("text", ("default",)), _shown("int", 8)
    ('2ms', '30s', 'default', '8')
    """
    if kind == "duration":
        return format_duration(value)  # type: ignore[arg-type]
    if isinstance(value, tuple):
        return ",".join(value)
    return "none" if value in (None, "") else str(value)


HELP = "run the supervisor and its workers"


def configure(parser: argparse.ArgumentParser) -> None:
    from jobsup.cli.options import count, duration, env_note, positive_int

    types: dict[str, Callable[[str], Any]] = {
        "int": positive_int,
        "count": count,
        "duration": duration,
        "fraction": float,
        "text": str,
    }
    parser.description = (
        "Run the supervisor: it spawns --procs isolated worker processes, claims jobs in "
        "batches, hands them to idle workers, writes outcomes back, renews leases and "
        "runs the listener and the reaper. Every flag can also be set by the JOBSUP_* "
        "variable named in its help. SIGTERM, SIGHUP (the terminal closed) and "
        "Ctrl-C stop it gracefully; a second Ctrl-C stops it at once."
    )
    for flag, kind, text, choices in FLAGS:
        name = flag[2:].replace("-", "_")
        default = getattr(DEFAULTS, _FIELD.get(name, name))
        env = f"JOBSUP_{name.upper()}"
        value = os.environ.get(env, ",".join(default) if isinstance(default, tuple) else default)
        parser.add_argument(
            flag,
            type=types[kind],
            default=None if value == "" else value,
            choices=choices,
            help=f"{text} ({env_note(env, _shown(kind, default))})",
        )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.errors import BadInput

    if not args.app and not args.django:
        raise BadInput(
            "jobsup start needs --app module:attribute (or JOBSUP_APP), or --django settings.module (or JOBSUP_DJANGO)"
        )
    config = Config.from_args(args)
    from jobsup.supervisor.main import main

    return main(config, dsn=args.dsn, data_dir=args.data_dir)
