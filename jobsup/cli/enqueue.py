"""`jobsup enqueue`: one job from the arguments, or every line of a JSON-lines file in one transaction."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, BinaryIO

from jobsup.cli.options import connect, duration, integer, iso_time, job_ids, kind, positive_int
from jobsup.durations import parse_duration
from jobsup.errors import EXIT_OK, BadInput
from jobsup.job import PARENT_FAILURE_POLICIES, EncodedPayload, JobSpec, make_spec

if TYPE_CHECKING:
    from rich.progress import Progress

    from jobsup.app import App

HELP = "enqueue a job, or many from a JSON-lines file"

# Rows per statement of a bulk enqueue: large enough to amortise the round trip, small enough to show
# progress. The whole file still goes in one transaction.
ENQUEUE_CHUNK = 10_000
# Lines read between two updates of the progress bar while the file is checked: often enough to move,
# rarely enough that a million lines cost the bar a hundred updates.
PROGRESS_LINES = 10_000


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Enqueue KIND with an optional JSON payload, or every line of --file "
        "(one JSON object per line: kind, payload, queue, priority, delay, "
        "run_at, max_attempts, unique_key, key, after, on_parent_failure) in one "
        "transaction. With --file, --queue, --priority, --delay, --run-at, "
        "--max-attempts, --after and --on-parent-failure are the defaults of the "
        "lines that do not set that field. A job with --after (after: [ids] in a "
        "line) waits until each of those jobs has finished. The payload is a JSON "
        "object. With --app, what the flags and lines leave out takes the "
        "defaults of the kind's handler, and a kind the app has no handler for "
        "is refused."
    )
    p.add_argument("kind", nargs="?", metavar="KIND", type=kind)
    p.add_argument("payload", nargs="?", metavar="JSON")
    p.add_argument("--file", metavar="PATH", help="JSON-lines file of jobs, - for standard input")
    p.add_argument(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        help="the jobsup App of these kinds, e.g. examples.lab:app: its handlers' max_attempts, "
        "queue and priority are the defaults, and a kind it has no handler for is refused",
    )
    # None is "not given", so that with --app the handler's default applies; without it, JobSpec's
    # defaults (the ones the help names) do.
    p.add_argument("--queue", help="queue name (default: default); with --app, the handler's if it sets one")
    p.add_argument(
        "--priority", type=integer, help="higher runs first (default 0); with --app, the handler's if it sets one"
    )
    p.add_argument("--delay", type=duration, default=0.0, help="run after this long: 0.4, 400ms, 30s, 5m")
    p.add_argument(
        "--run-at", type=iso_time, help="run at this ISO time, with its zone: 2030-01-01T09:00+01:00, or Z for UTC"
    )
    p.add_argument(
        "--max-attempts",
        type=positive_int,
        help="attempts before dead (default 3); with --app, the handler's if it sets one",
    )
    p.add_argument("--unique-key", help="skip if a queued or running job has this key (not with --file)")
    p.add_argument(
        "--key",
        help="the job's key (an account, a customer), which its kind's per-key limits count by; with --app, "
        "the handler's key function computes it when not given",
    )
    p.add_argument(
        "--after",
        type=job_ids,
        action="extend",
        metavar="ID[,ID...]",
        help="wait until each of these jobs has finished: --after 12,13 or --after 12 --after 13",
    )
    p.add_argument(
        "--on-parent-failure",
        choices=PARENT_FAILURE_POLICIES,
        help="with --after: when one of them ends dead or cancelled, cancel this job too (default) or run it anyway",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='one JSON object: {"id": N or null, "skipped": bool}, with --file '
        '{"enqueued": N, "skipped": N, "seconds": S, "checking_seconds": S} (the whole command, and '
        "the part spent reading and checking the file)",
    )
    p.set_defaults(run=run)


_FILE_FIELDS = {
    "kind",
    "payload",
    "queue",
    "priority",
    "delay",
    "run_at",
    "max_attempts",
    "unique_key",
    "key",
    "after",
    "on_parent_failure",
}
# The flags of `enqueue` that are defaults for the lines of --file that do not set the field.
_FILE_DEFAULTS = ("queue", "priority", "delay", "run_at", "max_attempts", "after", "on_parent_failure")
# How to enqueue a kind the --app has no handler for, as its refusal says.
_ELSEWHERE = "jobsup enqueue without --app"
# Job ids are bigint, past the integer range of options.positive_int.


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    """The options the flags set: an unset one is left to the handler (with --app), else to JobSpec."""
    if args.on_parent_failure is not None and not args.after and not args.file:
        raise BadInput("--on-parent-failure says what a parent's failure does: give the parents with --after")
    flags = {name: getattr(args, name) for name in _FILE_DEFAULTS if getattr(args, name) is not None}
    if "after" in flags:
        flags["after"] = tuple(flags["after"])
    return flags


def _load_app(target: str | None) -> App | None:
    if not target:
        return None
    from jobsup.app import load_app

    # `module:attribute` names a module of the current directory, as for jobsup start (whose workers
    # add it) and python -m; the `jobsup` script alone would not find it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return load_app(target)


def _spec_from_line(number: int, line: str, defaults: dict[str, Any] | None = None, app: App | None = None) -> JobSpec:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadInput(f"line {number}: not JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise BadInput(f'line {number}: expected a JSON object with a "kind", got {type(obj).__name__}')
    unknown = set(obj) - _FILE_FIELDS
    if unknown:
        raise BadInput(
            f"line {number}: unknown field(s) {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(_FILE_FIELDS))})"
        )
    # null is "not given": the flag's value, as when the field is left out
    fields: dict[str, Any] = {name: value for name, value in obj.items() if value is not None}
    if "kind" not in fields:
        raise BadInput(f'line {number}: a job needs a "kind"')
    try:
        if "delay" in fields:
            delay = fields["delay"]
            if isinstance(delay, bool) or not isinstance(delay, (str, int, float)):
                raise BadInput(f'delay must be seconds or a duration like "400ms", not {delay!r}')
            fields["delay"] = parse_duration(delay)
        if "run_at" in fields:
            if not isinstance(fields["run_at"], str):
                raise BadInput(f"run_at must be an ISO time string, not {fields['run_at']!r}")
            fields["run_at"] = iso_time(fields["run_at"])
        if isinstance(fields.get("after"), list):
            fields["after"] = tuple(fields["after"])  # JobSpec's type; check_dependencies names what is wrong
        kind = fields["kind"]
        handler = app.defaults(kind) if app is not None and isinstance(kind, str) else {}
        spec = JobSpec(**{**handler, **(defaults or {}), **fields})  # the line, then a flag, then the handler
        spec.validate()
        if app is not None:
            app.refuse_unknown_kind(spec.kind, _ELSEWHERE)
            spec = app.spec(spec)  # its key, from the handler's key function
        return replace(spec, payload=EncodedPayload(spec.encoded_payload()))
    except (BadInput, argparse.ArgumentTypeError) as exc:
        raise BadInput(f"line {number}: {exc}") from None


def _read_specs(
    path: str, defaults: dict[str, Any] | None = None, app: App | None = None, progress: Progress | None = None
) -> list[JobSpec]:
    try:
        # Bytes, decoded line by line: a line that is not UTF-8 is named like any other bad line
        # (standard input's text layer would pass it on as surrogates, for the server to refuse).
        handle = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    specs = []
    with handle:
        size = _size(handle)
        task = None if progress is None else progress.add_task("reading and checking", total=size)
        read = shown = 0
        try:
            for number, raw in enumerate(handle, start=1):
                read += len(raw)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise BadInput(
                        f"line {number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
                    ) from None
                if line.strip():
                    specs.append(_spec_from_line(number, line, defaults, app))
                if task is not None and (number - shown >= PROGRESS_LINES or number == 1):
                    assert progress is not None
                    progress.update(task, completed=read, description=f"reading and checking: {number:,} lines")
                    shown = number
        except OSError as exc:  # a directory, or a read error
            raise BadInput(f"cannot read {path}: {exc.strerror}") from None
        if task is not None:
            assert progress is not None
            progress.update(task, completed=read, total=read, visible=False)
    return specs


def _size(handle: BinaryIO) -> int | None:
    """The size of a regular file, for the progress bar; None for a pipe or a terminal."""
    try:
        status = os.fstat(handle.fileno())
    except (OSError, ValueError):
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def _jobs(n: int) -> str:
    return f"{n} job{'' if n == 1 else 's'}"


def _enqueue_file(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    # The whole command is timed, from the entry point's first line (args.started): reading and
    # checking the file (most of it, on a large file) and loading the command included.
    started = args.started
    if args.unique_key is not None:
        raise BadInput('--unique-key names one job; with --file, give each line its own "unique_key"')
    app = _load_app(args.app)
    with Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        # All of it is checked before anything is written; the bar moves from the first line read.
        reading = time.perf_counter()
        specs = _read_specs(args.file, _flags(args), app, progress)
        checked = time.perf_counter() - reading
        inserted = _write(args, specs, progress)
    skipped = len(specs) - inserted
    took = time.perf_counter() - started
    if args.json:
        print(
            json.dumps(
                {
                    "enqueued": inserted,
                    "skipped": skipped,
                    "seconds": round(took, 3),
                    "checking_seconds": round(checked, 3),
                }
            )
        )
        return EXIT_OK
    note = f" ({skipped} skipped: unique_key already queued or running)" if skipped else ""
    print(f"enqueued {_jobs(inserted)} in {took:.2f}s ({checked:.2f}s of it reading and checking){note}")
    return EXIT_OK


def _write(args: argparse.Namespace, specs: list[JobSpec], progress: Progress) -> int:
    """Enqueue `specs` in one transaction, in chunks that move the bar; how many were inserted."""
    from jobsup.client import enqueue_many

    inserted = 0
    with connect(args) as conn:
        task = progress.add_task("enqueueing", total=len(specs))
        with conn.transaction():
            for start in range(0, len(specs), ENQUEUE_CHUNK):
                chunk = specs[start : start + ENQUEUE_CHUNK]
                inserted += sum(1 for job_id in enqueue_many(conn, chunk) if job_id is not None)
                progress.advance(task, len(chunk))
    return inserted


def run(args: argparse.Namespace) -> int:
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
    from jobsup.client import enqueue

    app = _load_app(args.app)
    options = {**_flags(args), "unique_key": args.unique_key, "key": args.key}
    spec = make_spec(args.kind, payload, options, app.defaults(args.kind) if app is not None else None)
    if app is not None:
        app.refuse_unknown_kind(spec.kind, _ELSEWHERE)
        spec = app.spec(spec)  # its key, from the handler's key function
    spec.encoded_payload()
    with connect(args) as conn:
        job_id = enqueue(conn, spec)
    # A skipped duplicate is a success (the job the key names exists): exit 0 either way, and a script
    # tells them apart by the output (README, "enqueue").
    if args.json:
        print(json.dumps({"id": job_id, "skipped": job_id is None}))
    elif job_id is None:
        print(f"skipped: a job with unique key {args.unique_key!r} is already queued or running")
    elif spec.after:
        print(f"enqueued job {job_id}, after {', '.join(map(str, dict.fromkeys(spec.after)))}")
    else:
        print(f"enqueued job {job_id}")
    return EXIT_OK
