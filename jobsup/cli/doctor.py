"""`jobsup doctor`: flags, and one line per check with what to do about each problem."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import fields

from jobsup.ops.doctor import Report, Thresholds, run_checks

# Each threshold: (flag, kind, what crossing it means). The flag's variable is JOBSUP_DOCTOR_<NAME>,
# its default Thresholds'; 0 turns the warning off.
FLAGS: list[tuple[str, str, str]] = [
    (
        "--max-xmin-age",
        "duration",
        "warn when a snapshot, transaction or prepared transaction has held back vacuum longer than this",
    ),
    ("--max-idle-in-transaction", "duration", "warn when a session has been idle in a transaction longer"),
    ("--max-dead-tuples", "count", "warn when a jobsup table has more dead tuples"),
    (
        "--max-dead-ratio",
        "fraction",
        "warn when more than this share of a jobsup table's tuples are dead (once it has 10,000 dead)",
    ),
    ("--max-notify-usage", "fraction", "warn when more than this share of the NOTIFY queue is in use"),
    (
        "--max-connections-used",
        "fraction",
        "warn when more than this share of the connections open to non-superusers is in use",
    ),
    ("--stale-after", "duration", "a supervisor whose last heartbeat is older is reported dead"),
]

_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {text}")
    return value


def _shown(kind: str, value: float) -> str:
    """
    >>> _shown("duration", 300.0), _shown("duration", 0.5), _shown("count", 1_000_000), _shown("fraction", 0.8)
    ('5m', '500ms', '1000000', '0.8')
    """
    if kind == "duration":
        for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
            if value >= size and value % size == 0:
                return f"{value / size:g}{unit}"
        return f"{value * 1000:g}ms"
    return str(value) if kind == "count" else f"{value:g}"


HELP = "check the database's health; exit 1 on a problem"


def configure(parser: argparse.ArgumentParser) -> None:
    from jobsup.cli.options import duration as _duration
    from jobsup.cli.options import integer as _int

    types = {"duration": _duration, "count": _int, "fraction": _fraction}
    parser.description = (
        "Check the queue's database: what holds back vacuum (old snapshots, idle "
        "transactions, prepared transactions, replication slots), dead tuples and sizes of "
        "the jobsup tables, the NOTIFY queue, connections, dead supervisors and their "
        "orphaned jobs, schema and server versions. Exit 0 when healthy, 1 when a check "
        "warns or fails. Every threshold also comes from the JOBSUP_DOCTOR_* variable in "
        "its help; 0 turns that warning off."
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    defaults = Thresholds()
    for flag, kind, text in FLAGS:
        name = flag[2:].replace("-", "_")
        env = f"JOBSUP_DOCTOR_{name.upper()}"
        default = getattr(defaults, name)
        parser.add_argument(
            flag,
            type=types[kind],
            default=os.environ.get(env, default),
            metavar=kind.upper(),
            help=f"{text} (env {env}; default {_shown(kind, default)})",
        )
    parser.set_defaults(run=run)


def _thresholds(args: argparse.Namespace) -> Thresholds:
    from jobsup.errors import BadInput

    values = {f.name: getattr(args, f.name) for f in fields(Thresholds)}
    if values["max_dead_tuples"] < 0:
        raise BadInput(f"--max-dead-tuples cannot be negative: {values['max_dead_tuples']}")
    return Thresholds(**values)


def print_report(report: Report) -> None:
    width = max(len(c.name) for c in report.checks)
    for check in report.checks:
        print(f"{_MARK[check.level]}  {check.name:<{width}}  {check.message}")
        if check.action:
            print(f"      {'':<{width}}  -> {check.action}")
    problems = report.problems
    if problems:
        print(f"{len(problems)} problem{'s' if len(problems) != 1 else ''}: {', '.join(c.name for c in problems)}")
    else:
        print("healthy")


def run(args: argparse.Namespace) -> int:
    from jobsup.cli.options import connect

    thresholds = _thresholds(args)
    with connect(args, check_schema=False) as conn:  # a missing or old schema is one of the findings
        report = run_checks(conn, thresholds)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print_report(report)
    return report.exit_code
