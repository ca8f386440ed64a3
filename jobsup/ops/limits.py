"""The limits in force: what a supervisor's app declares when it starts, what an operator sets with
`jobsup limit`, and the kinds' rows as `jobsup limit` and the console list them.

Who wins: an operator's values (set_by) over any app's until `jobsup limit KIND --reset`; between apps,
the last supervisor to start (a rolling deploy's new code). Each change is one transaction under the
kind's row lock, so a claim sees the old limits or the new, and is announced on the jobsup channel.
A kind that gains its first limit (or loses its last) moves its live jobs between the ready index and
the limited one in that same transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row
from jobsup.errors import BadInput
from jobsup.limits import Limits
from jobsup.ops.snapshot import THROTTLED_COUNTED, LimitedKind, limited_kinds

# How long a change that makes a kind limited waits for transactions begun before it, which may be
# inserting jobs of the kind unmarked (their trigger ran before the limit existed), to mark them too.
OLDER_WRITERS_WAIT = 5.0
# Tries of a limit change that PostgreSQL aborts to break a deadlock with running supervisors.
DEADLOCK_TRIES = 5
# Kinds are names: the same rule as a queue's, checked before anything is written.
MAX_KIND_LENGTH = 200

T = TypeVar("T")


@dataclass(frozen=True)
class Change:
    """What one declaration or operator's command did to a kind's limits."""

    kind: str
    before: Limits
    after: Limits
    declared: Limits | None = None  # the app's, when an operator's values override it
    set_by: str | None = None  # the operator whose values are in force


def check_kind(kind: Any) -> str:
    if not isinstance(kind, str) or not kind.strip() or len(kind) > MAX_KIND_LENGTH or kind != kind.strip():
        raise BadInput(f"a kind is a non-empty name of at most {MAX_KIND_LENGTH} characters, not {kind!r}")
    return kind


def declare(conn: psycopg.Connection, declared: Mapping[str, Limits], kinds: Iterable[str], by: str) -> list[Change]:
    """Record what an app declares for the kinds it handles (`kinds`; those without an entry declare no
    limit): the values in force follow, unless an operator's override them. The changes, for the log."""
    kinds = set(kinds) | set(declared)
    # One read for every kind, then a transaction only for those with a row or a limit declared: an
    # app of many kinds and no limits costs a supervisor's start (and every drain) one statement.
    with_rows = {row[0] for row in conn.execute(SQL["limits_of_kinds"], {"kinds": sorted(kinds)})}
    changes = []
    for kind in sorted(kinds):
        limits = declared.get(kind, Limits())
        if kind not in with_rows and not limits.limited:
            continue
        change = _change(conn, kind, by, _declared(limits), declares=limits)
        if change is not None:
            changes.append(change)
    return changes


def _declared(limits: Limits) -> Callable[[Mapping[str, Any] | None], tuple[Limits, str | None]]:
    """What an app's declaration puts in force: its limits, set by no operator."""
    return lambda row: (limits, None)


def set_limits(conn: psycopg.Connection, kind: str, by: str, **given: Any) -> Change:
    """An operator's values for `kind`: the dimensions given (None removes one) over those in force."""
    check_kind(kind)

    def values(row: Mapping[str, Any] | None) -> tuple[Limits, str]:
        current = Limits.from_columns(row) if row else Limits()
        return Limits.of(kind, **{**_as_given(current), **given}), by

    change = _change(conn, kind, by, values)
    assert change is not None
    return change


def reset(conn: psycopg.Connection, kind: str, by: str) -> Change:
    """Drop an operator's values: the app's declaration (none, if no app declared one) is in force."""
    check_kind(kind)

    def values(row: Mapping[str, Any] | None) -> tuple[Limits, str | None]:
        return Limits.from_json(kind, row["declared"] if row else None), None

    if conn.execute(SQL["limit_exists"], {"kind": kind}).fetchone() is None:
        raise BadInput(f"kind {kind!r} has no limits to reset: neither an app nor an operator has set any")
    change = _change(conn, kind, by, values)
    assert change is not None
    return change


def kind_known(conn: psycopg.Connection, kind: str) -> bool:
    """Whether an app declares `kind`, a live supervisor handles it or a job of it exists (or finished):
    limits for a kind that none of them knows are most likely for a misspelt one."""
    return bool(one_row(conn.execute(SQL["limit_kind_known"], {"kind": kind}).fetchone(), "limit_kind_known")[0])


def _as_given(limits: Limits) -> dict[str, Any]:
    """Limits as Limits.of's keywords, so an operator's change of one dimension keeps the others."""
    return {
        "concurrency": limits.concurrency,
        "rate": limits.rate,
        "burst": None,
        "key_concurrency": limits.key_concurrency,
        "key_rate": limits.key_rate,
        "key_burst": None,
    }


def _change(
    conn: psycopg.Connection,
    kind: str,
    by: str,
    values: Callable[[Mapping[str, Any] | None], tuple[Limits, str | None]],
    declares: Limits | None = None,
) -> Change | None:
    """One change of a kind's row under its lock: `values(row)` gives the limits in force after it and
    who set them (None: the app). None when nothing changed and there is no row to keep."""
    change = _retrying(lambda: _write_change(conn, kind, by, values, declares))
    if change is not None and change.after.limited != change.before.limited:
        _retrying(lambda: _mark_late_inserts(conn, kind, change.after.limited))
    return change


def _retrying(attempt: Callable[[], T]) -> T:
    """`attempt()`, again if PostgreSQL broke a deadlock by aborting it. A change moves the kind's live
    jobs between the ready index and claim_limited's (limit_mark_jobs), row by row, while running
    supervisors lock the same rows, and the kind's limits row, in the order of their own statements:
    `jobsup limit --remove` once failed so on a drain of four supervisors."""
    for tries in range(1, DEADLOCK_TRIES + 1):
        try:
            return attempt()
        except psycopg.errors.DeadlockDetected:
            if tries == DEADLOCK_TRIES:
                raise
            time.sleep(0.05 * tries)
    raise AssertionError("unreachable")


def _write_change(
    conn: psycopg.Connection,
    kind: str,
    by: str,
    values: Callable[[Mapping[str, Any] | None], tuple[Limits, str | None]],
    declares: Limits | None,
) -> Change | None:
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(SQL["limit_lock"], {"kind": kind}).fetchone()
        if row is None:
            if declares is not None and not declares.limited:
                return None  # an app without limits for a kind nobody limited: nothing to record
            cur.execute(SQL["limit_insert"], {"kind": kind})
            row = cur.execute(SQL["limit_lock"], {"kind": kind}).fetchone()
            assert row is not None
        before = Limits.from_columns(row)
        if declares is not None:
            cur.execute(SQL["limit_declared"], {"kind": kind, "declared": Jsonb(declares.to_json()), "by": by})
            if row["set_by"] is not None:  # an operator's values win: keep them
                return Change(kind, before, before, declared=declares, set_by=row["set_by"])
        after, set_by = values(row)
        cur.execute(SQL["limit_write"], {"kind": kind, "set_by": set_by, **after.columns()})
        if after.key_rate is None:
            cur.execute(SQL["limit_keys_forget"], {"kind": kind})
        elif after.key_rate != before.key_rate:
            cur.execute(SQL["limit_keys_clamp"], {"kind": kind, **after.columns()})
        if before.limited != after.limited:
            cur.execute(SQL["limit_mark_jobs"], {"kind": kind, "limited": after.limited})
        if before != after or declares is None:
            keyed = after.key_concurrency is not None or after.key_rate is not None
            cur.execute(SQL["limit_notify"], {"kind": kind, "limited": after.limited, "keyed": keyed})
        if not after.limited and not Limits.from_json(kind, row["declared"]).limited:
            # No limit in force and none an app declares: a row would only list the kind with nothing
            # (and an operator's "none" would outlive the kind). Without a row the kind is as if never limited.
            cur.execute(SQL["limit_delete"], {"kind": kind})
    return Change(kind, before, after, declared=declares, set_by=set_by)


def _mark_late_inserts(conn: psycopg.Connection, kind: str, limited: bool) -> None:
    """Mark (or unmark) the jobs of `kind` that transactions begun before its first limit was set (its
    last removed) insert after that committed, as their insert trigger saw the limits before: wait (a
    few seconds at most) until none of those is open, then mark what they left as it was. Unmarked,
    a limited job would be claimed past its limit; left marked, no claim would take it at all."""
    deadline = time.monotonic() + OLDER_WRITERS_WAIT
    since = one_row(conn.execute("SELECT clock_timestamp()").fetchone(), "clock_timestamp")[0]
    while time.monotonic() < deadline:
        row = conn.execute(SQL["limit_older_writers"], {"since": since}).fetchone()
        if row is None or row[0] == 0:
            break
        time.sleep(0.05)
    with conn.transaction():
        conn.execute(SQL["limit_mark_jobs"], {"kind": kind, "limited": limited})


def list_limits(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every kind with a row in jobsup.limits, as `jobsup limit --json` prints it: with what a limited
    kind holds, and its ready jobs split as `jobsup stats` and the console split them: `throttled`
    (held back by its limits) and `startable` (allowed to start now: they wait for a free worker)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(SQL["limits_list"]).fetchall()
        counted = {
            k.kind: k for k in limited_kinds(cur.execute(SQL["limited_kinds"], {"counted": THROTTLED_COUNTED + 1}))
        }
    out = []
    for row in rows:
        figures = counted.get(row["kind"]) or LimitedKind(row["kind"], Limits())
        out.append(
            {
                "kind": row["kind"],
                "limits": Limits.from_columns(row).to_json(),
                "declared": row["declared"],
                "declared_by": row["declared_by"],
                "set_by": row["set_by"],
                "set_at": row["set_at"].isoformat() if row["set_at"] else None,
                "held": figures.held,
                "throttled": figures.throttled,
                "throttled_capped": figures.throttled_capped,
                "startable": figures.startable,
                "next_start": row["next_start"].isoformat() if row["next_start"] else None,
            }
        )
    return out


def in_force(conn: psycopg.Connection) -> list[str]:
    """The kinds with a limit in force, sorted."""
    return kinds_in_force(conn)[0]


def kinds_in_force(conn: psycopg.Connection) -> tuple[list[str], list[str]]:
    """The kinds with a limit in force, and those of them with per-key limits, sorted."""
    row = one_row(conn.execute(SQL["limits_in_force"]).fetchone(), "limits_in_force")
    return list(row[0]), list(row[1])
