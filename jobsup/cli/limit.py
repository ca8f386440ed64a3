"""`jobsup limit`: list the limits in force, or set, reset or remove a kind's on every supervisor."""

from __future__ import annotations

import argparse
import json
from typing import Any

from jobsup.cli.actions import audit
from jobsup.cli.options import connect, kind
from jobsup.errors import EXIT_OK, BadInput

HELP = "list limits, or set a kind's concurrency and rate limits on every supervisor"

# The options that set one dimension, and the keyword of jobsup.ops.limits.set_limits each gives.
_DIMENSIONS = {
    "concurrency": "concurrency",
    "rate": "rate",
    "burst": "burst",
    "key_concurrency": "key_concurrency",
    "key_rate": "key_rate",
    "key_burst": "key_burst",
}


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Without options, list every kind with limits: those in force, what the app declares, who set "
        "them, what each holds, and its ready jobs: how many they hold back (throttled) and how many they "
        "allow to start now, which wait for a free worker (startable). With options, "
        "set KIND's limits for every supervisor (they obey within a heartbeat, at once when they hear the "
        "NOTIFY): the values given replace those in force, `none` removes one, and an operator's values "
        "win over what any app declares until --reset."
    )
    p.add_argument("kind", nargs="?", metavar="KIND", type=kind, help="the kind to show or change")
    p.add_argument("--concurrency", metavar="N", help="at most N jobs of the kind held at once (none: no limit)")
    p.add_argument("--rate", metavar="R", help="at most R starts of the kind, such as 50/s, 100/m (none: no limit)")
    p.add_argument("--burst", metavar="N", help="with --rate: up to N starts at once after a quiet spell (default 1)")
    p.add_argument("--key-concurrency", metavar="N", help="at most N jobs of one key held at once (none: no limit)")
    p.add_argument("--key-rate", metavar="R", help="at most R starts of one key, such as 10/s (none: no limit)")
    p.add_argument("--key-burst", metavar="N", help="with --key-rate: up to N starts of one key at once")
    p.add_argument(
        "--new-kind",
        action="store_true",
        help="set limits on a kind that no handler declares and no job has yet (refused without it: a typo?)",
    )
    p.add_argument("--reset", action="store_true", help="drop the operator's values: what the app declares is in force")
    p.add_argument(
        "--remove",
        action="store_true",
        help="no limits on KIND, whatever the app declares (until --reset); a kind no app limits keeps no row",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The dimensions the command line sets: a value, or None for `none`."""
    given: dict[str, Any] = {}
    for option, keyword in _DIMENSIONS.items():
        value = getattr(args, option)
        if value is not None:
            given[keyword] = None if value.strip().lower() == "none" else value
    return given


def run(args: argparse.Namespace) -> int:
    from jobsup.ops.control import operator
    from jobsup.ops.limits import check_kind, kind_known, list_limits, reset, set_limits

    given = _given(args)
    changing = bool(given) or args.reset or args.remove
    if args.kind is not None:
        check_kind(args.kind)
    if changing and args.kind is None:
        raise BadInput("name the KIND whose limits to change: jobsup limit KIND --concurrency 3")
    if sum((bool(given), args.reset, args.remove)) > 1:
        raise BadInput("give new values, --reset or --remove, one of them")
    if args.new_kind and not given:
        raise BadInput("--new-kind goes with new values: jobsup limit KIND --concurrency 3 --new-kind")
    if given:
        # Checked in full before anything is written: a bad value is one line and no change.
        from jobsup.limits import Limits

        Limits.of(args.kind, **{k: v for k, v in given.items() if v is not None and not k.endswith("burst")})
    with connect(args) as conn:
        if args.reset:
            change = reset(conn, args.kind, operator())
        elif args.remove:
            change = set_limits(
                conn, args.kind, operator(), concurrency=None, rate=None, key_concurrency=None, key_rate=None
            )
        elif given:
            if not args.new_kind and not kind_known(conn, args.kind):
                raise BadInput(
                    f"no handler declares kind {args.kind!r} and no job has it (a typo?); "
                    "to limit it before its first job, add --new-kind"
                )
            change = set_limits(conn, args.kind, operator(), **given)
        else:
            rows = list_limits(conn)
            if args.kind is not None:
                rows = [r for r in rows if r["kind"] == args.kind]
            _print(rows, args.json)
            return EXIT_OK
        audit(
            conn,
            "limit reset" if args.reset else "limit",
            f"kind {args.kind}",
            detail=f"limits of kind {args.kind}: {change.before} → {change.after}",
        )
    if args.json:
        print(json.dumps({"kind": change.kind, "was": change.before.to_json(), "limits": change.after.to_json()}))
    else:
        print(f"{change.kind}: {change.after} (was {change.before})")
    return EXIT_OK


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        print("no limits")
        return
    from jobsup.limits import Limits

    for row in rows:
        limits = Limits.from_json(row["kind"], row["limits"])
        source = f"set by {row['set_by']}" if row["set_by"] else f"declared by {row['declared_by'] or '?'}"
        throttled = f"{row['throttled']:,}" + ("+" if row["throttled_capped"] else "")
        counts = f"held {row['held']}, throttled {throttled}, startable {row['startable']:,}"
        print(f"{row['kind']}: {limits}; {source}; {counts}")
