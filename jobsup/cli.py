"""The `jobsup` command: migrate, enqueue, stats, requeue-dead, db, and (from their modules) start, top, doctor."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from . import __version__, dsn as dsns, embedded, options
from .durations import parse_duration
from .errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, BadInput, JobsupError, first_line
from .job import EncodedPayload, JobSpec

# Rows per statement of a bulk enqueue: large enough to amortise the round trip, small enough to show
# progress. The whole file still goes in one transaction.
ENQUEUE_CHUNK = 10_000


# The shared argument types, under the names the subcommand modules import them by.
_Parser = options.Parser
_duration = options.duration
_positive_int = options.positive_int
_int = options.integer
_iso_time = options.iso_time
database_options = options.database_options


connect = options.connect


# --- migrate ---------------------------------------------------------------------------------------

def cmd_migrate(args: argparse.Namespace) -> int:
    from .migrate import LATEST, migrate

    with connect(args, check_schema=False) as conn:
        applied = migrate(conn)
    if applied:
        for m in applied:
            print(f"applied migration {m.version:04d}_{m.name}")
    else:
        print(f"schema up to date (version {LATEST})")
    return EXIT_OK


# --- enqueue ---------------------------------------------------------------------------------------

_FILE_FIELDS = {"kind", "payload", "queue", "priority", "delay", "run_at", "max_attempts", "unique_key"}
# The flags of `enqueue` that are defaults for the lines of --file that do not set the field.
_FILE_DEFAULTS = ("queue", "priority", "delay", "run_at", "max_attempts")


def _spec_from_line(number: int, line: str, defaults: dict[str, Any] | None = None) -> JobSpec:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadInput(f"line {number}: not JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise BadInput(f"line {number}: expected a JSON object with a \"kind\", got {type(obj).__name__}")
    unknown = set(obj) - _FILE_FIELDS
    if unknown:
        raise BadInput(f"line {number}: unknown field(s) {', '.join(sorted(unknown))} "
                       f"(allowed: {', '.join(sorted(_FILE_FIELDS))})")
    # null is "not given": the flag's value, as when the field is left out
    fields: dict[str, Any] = {name: value for name, value in obj.items() if value is not None}
    if "kind" not in fields:
        raise BadInput(f"line {number}: a job needs a \"kind\"")
    try:
        if "delay" in fields:
            delay = fields["delay"]
            if isinstance(delay, bool) or not isinstance(delay, (str, int, float)):
                raise BadInput(f"delay must be seconds or a duration like \"400ms\", not {delay!r}")
            fields["delay"] = parse_duration(delay)
        if "run_at" in fields:
            if not isinstance(fields["run_at"], str):
                raise BadInput(f"run_at must be an ISO time string, not {fields['run_at']!r}")
            fields["run_at"] = _iso_time(fields["run_at"])
        spec = JobSpec(**{**(defaults or {}), **fields})
        spec.validate()
        return replace(spec, payload=EncodedPayload(spec.encoded_payload()))
    except (BadInput, argparse.ArgumentTypeError) as exc:
        raise BadInput(f"line {number}: {exc}") from None


def _read_specs(path: str, defaults: dict[str, Any] | None = None) -> list[JobSpec]:
    try:
        # Bytes, decoded line by line: a line that is not UTF-8 is named like any other bad line
        # (standard input's text layer would pass it on as surrogates, for the server to refuse).
        handle = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    specs = []
    with handle:
        try:
            for number, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise BadInput(f"line {number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                                   f"at column {exc.start + 1})") from None
                if line.strip():
                    specs.append(_spec_from_line(number, line, defaults))
        except OSError as exc:  # a directory, or a read error
            raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    return specs


def _jobs(n: int) -> str:
    return f"{n} job{'' if n == 1 else 's'}"


def _enqueue_file(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from .queue import enqueue_many

    if args.unique_key is not None:
        raise BadInput("--unique-key names one job; with --file, give each line its own \"unique_key\"")
    defaults = {name: getattr(args, name) for name in _FILE_DEFAULTS}
    specs = _read_specs(args.file, defaults)  # all of it is checked before anything is written
    started = time.perf_counter()
    inserted = 0
    with connect(args) as conn, Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("enqueueing", total=len(specs))
        with conn.transaction():
            for start in range(0, len(specs), ENQUEUE_CHUNK):
                chunk = specs[start:start + ENQUEUE_CHUNK]
                inserted += sum(1 for job_id in enqueue_many(conn, chunk) if job_id is not None)
                progress.advance(task, len(chunk))
    skipped = len(specs) - inserted
    took = time.perf_counter() - started
    if args.json:
        print(json.dumps({"enqueued": inserted, "skipped": skipped, "seconds": round(took, 3)}))
        return EXIT_OK
    note = f" ({skipped} skipped: unique_key already queued or running)" if skipped else ""
    print(f"enqueued {_jobs(inserted)} in {took:.2f}s{note}")
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace) -> int:
    if args.file:
        if args.kind or args.payload:
            raise BadInput("give either KIND [JSON] or --file, not both")
        return _enqueue_file(args)
    if not args.kind:
        raise BadInput("enqueue needs a KIND (or --file jobs.jsonl)")
    payload: Any = None
    if args.payload is not None:
        try:
            payload = json.loads(args.payload)
        except json.JSONDecodeError as exc:
            raise BadInput(f"payload is not JSON: {exc.msg} (column {exc.colno})") from None
    from .queue import enqueue

    spec = JobSpec(args.kind, payload, queue=args.queue, priority=args.priority, delay=args.delay,
                   run_at=args.run_at, max_attempts=args.max_attempts, unique_key=args.unique_key)
    spec.validate()
    spec.encoded_payload()
    with connect(args) as conn:
        job_id = enqueue(conn, spec)
    # A skipped duplicate is a success (the job the key names exists): exit 0 either way, and a script
    # tells them apart by the output (README, "enqueue").
    if args.json:
        print(json.dumps({"id": job_id, "skipped": job_id is None}))
    elif job_id is None:
        print(f"skipped: a job with unique key {args.unique_key!r} is already queued or running")
    else:
        print(f"enqueued job {job_id}")
    return EXIT_OK


# --- stats, requeue-dead, db -------------------------------------------------------------------------

def cmd_stats(args: argparse.Namespace) -> int:
    from .stats import print_snapshot
    from .visibility import snapshot

    with connect(args) as conn:
        snap = snapshot(conn, dead_limit=args.dead)
    if args.json:
        print(json.dumps(snap.to_json(), indent=2, default=str))
    else:
        print_snapshot(snap)
    return EXIT_OK


def cmd_requeue_dead(args: argparse.Namespace) -> int:
    from .queue import requeue_dead

    with connect(args) as conn:
        ids = requeue_dead(conn, ids=args.id or None, kind=args.kind, error=args.error)
    scope = " and ".join(filter(None, [f"kind {args.kind}" if args.kind else "",
                                       f"error {args.error!r}" if args.error else "",
                                       f"ids {', '.join(map(str, args.id))}" if args.id else ""]))
    print(f"requeued {len(ids)} dead job{'s' if len(ids) != 1 else ''}" + (f" ({scope})" if scope else ""))
    return EXIT_OK


def cmd_db(args: argparse.Namespace) -> int:
    if args.dsn:
        raise BadInput(f"jobsup db {args.action} manages the embedded PostgreSQL of --data-dir; "
                       "--dsn names a server of your own, which it does not touch")
    data_dir = embedded.data_dir_from(args.data_dir)
    if args.action == "start":
        print(embedded.ensure_running(data_dir))
    elif args.action == "url":
        running = embedded.running_dsn(data_dir)
        if running is None:
            print(f"no embedded PostgreSQL is running in {data_dir} (jobsup db start)", file=sys.stderr)
            return EXIT_FAILURE
        print(running)
    elif args.action == "stop":
        print(f"stopped the embedded PostgreSQL in {data_dir}" if embedded.stop(data_dir)
              else f"no embedded PostgreSQL was running in {data_dir}")
    return EXIT_OK


# --- the parser ----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from . import bench, check_cli, control_cli, cron_cli, doctor_cli, exporter_cli, retention_cli
    from .monitor import cli as monitor_cli
    from .supervisor import cli as supervisor_cli

    db = database_options()
    parser = _Parser(prog="jobsup", description="A PostgreSQL job queue with a process supervisor and a console.")
    parser.add_argument("--version", action="version", version=f"jobsup {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("migrate", parents=[db], help="create or upgrade the jobsup schema")
    p.set_defaults(run=cmd_migrate)

    p = sub.add_parser("enqueue", parents=[db], help="enqueue a job, or many from a JSON-lines file",
                       description="Enqueue KIND with an optional JSON payload, or every line of --file "
                                   "(one JSON object per line: kind, payload, queue, priority, delay, "
                                   "run_at, max_attempts, unique_key) in one transaction. With --file, "
                                   "--queue, --priority, --delay, --run-at and --max-attempts are the "
                                   "defaults of the lines that do not set that field.")
    p.add_argument("kind", nargs="?", metavar="KIND")
    p.add_argument("payload", nargs="?", metavar="JSON")
    p.add_argument("--file", metavar="PATH", help="JSON-lines file of jobs, - for standard input")
    p.add_argument("--queue", default="default", help="queue name (default: default)")
    p.add_argument("--priority", type=_int, default=0, help="higher runs first (default 0)")
    p.add_argument("--delay", type=_duration, default=0.0, help="run after this long: 0.4, 400ms, 30s, 5m")
    p.add_argument("--run-at", type=_iso_time, help="run at this ISO time")
    p.add_argument("--max-attempts", type=_positive_int, default=3, help="attempts before dead (default 3)")
    p.add_argument("--unique-key", help="skip if a queued or running job has this key (not with --file)")
    p.add_argument("--json", action="store_true",
                   help='one JSON object: {"id": N or null, "skipped": bool}, with --file '
                        '{"enqueued": N, "skipped": N, "seconds": S}')
    p.set_defaults(run=cmd_enqueue)

    p = sub.add_parser("stats", parents=[db], help="counts by status and kind, latency and run time per kind, "
                       "oldest ready job, dead jobs,"
                       " expiring leases, attempts")
    p.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    p.add_argument("--dead", type=_positive_int, default=10, metavar="N", help="dead jobs to list (default 10)")
    p.set_defaults(run=cmd_stats)

    p = sub.add_parser("requeue-dead", parents=[db], help="queue dead jobs again, attempts reset",
                       description="Requeue every dead job, or those of --kind / --error / --id.")
    p.add_argument("--kind", help="only dead jobs of this kind")
    p.add_argument("--error", help="only dead jobs whose last error is exactly this")
    p.add_argument("--id", type=_positive_int, action="extend", nargs="+", metavar="N",
                   help="only these jobs: --id 2 76906, or --id 2 --id 76906")
    p.set_defaults(run=cmd_requeue_dead)

    p = sub.add_parser("db", parents=[db], help="the embedded PostgreSQL: start, url, stop")
    p.add_argument("action", choices=["start", "url", "stop"])
    p.set_defaults(run=cmd_db)

    retention_cli.configure(sub.add_parser("prune", parents=[db], help="delete finished jobs past their window"))
    supervisor_cli.configure(sub.add_parser("start", parents=[db], help="run the supervisor and its workers"))
    monitor_cli.configure(sub.add_parser("top", parents=[db], help="the live console"))
    doctor_cli.configure(sub.add_parser("doctor", parents=[db], help="check the database's health; exit 1 on a problem"))
    cron_cli.configure(sub.add_parser("cron", parents=[db], help="schedules: list, run, pause, resume"))
    bench.configure(sub.add_parser("bench", parents=[db], help="measure jobsup on this database"))
    control_cli.configure(sub, db)  # cancel, pause, resume, retry
    check_cli.configure(sub.add_parser("check", parents=[db], help="alert checks: oldest ready job, dead jobs, "
                                       "reaping; exit 1 when a threshold is crossed"))
    exporter_cli.configure(sub.add_parser("metrics", parents=[db], help="serve the queue-wide gauges for Prometheus"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import psycopg

    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except JobsupError as exc:
        print(f"jobsup: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except psycopg.Error as exc:
        print(f"jobsup: database error: {dsns.redact(first_line(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
