"""Is the queue's database healthy? The checks of `jobsup doctor` and the console's one-line warning.

A PostgreSQL queue dies of bloat: a forgotten transaction or snapshot holds back vacuum, dead tuples
pile up in the churning jobs table, and the claim slows until the backlog cannot recover. The checks
name what holds vacuum back and what it costs, and say what to do. Each reads the server's views and
statistics, the supervisors' rows and the partial index of running jobs, never the finished jobs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from jobsup.db.migrate import LATEST, schema_version
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.durations import format_age
from jobsup.errors import EXIT_FAILURE, EXIT_OK
from jobsup.ops.unserved import Unserved, unserved

Level = Literal["ok", "warn", "fail"]

# The connections a running supervisor holds at most: jobsup/supervisor/supervisor.py opens one Link of
# each, named "jobsup <link>" in application_name, "writes" with its first outcome (and one more for a
# moment while it starts), "schedules" only for an app with schedules. Its worker processes hold none.
# tests/test_doctor.py counts them on a real supervisor.
SUPERVISOR_LINKS = ("claims", "writes", "house", "listen", "prune", "schedules")
CONSOLE_APPLICATION = "jobsup top"
# Below this many dead tuples a table's dead share is no warning: a queue of 40 live jobs that has
# just finished 400 is 90% dead and perfectly healthy.
DEAD_RATIO_FLOOR = 10_000
# Most sessions holding back vacuum or idle in a transaction that the report lists.
SESSION_LIMIT = 20
# The doctor waits this long for a locked table, and this long for any statement, before it reports.
LOCK_TIMEOUT = "2s"
STATEMENT_TIMEOUT = "30s"


@dataclass(frozen=True)
class Thresholds:
    """Where a figure becomes a warning. 0 turns that warning off (the figure is still reported)."""

    max_xmin_age: float = 300.0  # seconds a snapshot, transaction id or prepared transaction may hold vacuum back
    max_idle_in_transaction: float = 300.0  # seconds a session may sit idle inside a transaction
    max_dead_tuples: int = 1_000_000  # dead tuples in one jobsup table
    max_dead_ratio: float = 0.5  # dead share of a table's tuples, once it has DEAD_RATIO_FLOOR dead
    max_notify_usage: float = 0.5  # share of the NOTIFY queue in use
    max_connections_used: float = 0.8  # share of the connections open to non-superusers in use
    stale_after: float = 30.0  # seconds since a supervisor's last heartbeat before it counts as dead


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    message: str  # one line: what was found
    action: str = ""  # what to do about it; empty when there is nothing to do
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    checks: list[Check]
    thresholds: Thresholds

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.level != "ok"]

    @property
    def exit_code(self) -> int:
        return EXIT_FAILURE if self.problems else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "healthy": not self.problems,
            "exit_code": self.exit_code,
            "thresholds": asdict(self.thresholds),
            "checks": [asdict(c) for c in self.checks],
        }


def over(value: float | None, limit: float) -> bool:
    """Whether `value` crosses a threshold; a limit of 0 is off, an unknown value crosses nothing."""
    return bool(limit) and value is not None and value > limit


def dead_share(live: int, dead: int) -> float:
    return dead / (live + dead) if live + dead else 0.0


def too_dead(live: int, dead: int, t: Thresholds) -> bool:
    """Whether a table's dead tuples cross the thresholds: too many, or too large a share of enough.

    >>> too_dead(40, 400, Thresholds()), too_dead(40, 20_000, Thresholds()), too_dead(0, 2_000_000, Thresholds())
    (False, True, True)
    """
    return over(dead, t.max_dead_tuples) or (
        dead >= DEAD_RATIO_FLOOR and over(dead_share(live, dead), t.max_dead_ratio)
    )


def _bytes(n: int) -> str:
    """
    >>> _bytes(512), _bytes(8192), _bytes(14 * 2**20 + 300_000), _bytes(3 * 2**30)
    ('512 B', '8 kB', '14.3 MB', '3.0 GB')
    """
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if unit != "kB" else f"{n // size} kB"
    return f"{n} B"


def _rows(conn: psycopg.Connection, name: str, **params: Any) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SQL[name], params or None)
        return cur.fetchall()


# --- the checks, each from rows already read -------------------------------------------------------


def check_server(server: dict[str, Any]) -> Check:
    sees = (
        "sees every session"
        if server["sees_all_sessions"]
        else (
            "sees other roles' sessions without their state, times or queries: grant it pg_monitor "
            "(or pg_read_all_stats) for the full picture"
        )
    )
    return Check(
        "server",
        "ok",
        f"PostgreSQL {server['server_version']}, database {server['database']}, role {server['role']} ({sees})",
        figures={
            k: server[k] for k in ("server_version", "server_version_num", "database", "role", "sees_all_sessions")
        },
    )


def check_schema(version: int) -> Check:
    figures = {"version": version, "package_version": LATEST}
    if version == 0:
        return Check("schema", "fail", "the jobsup schema is not in this database", "run `jobsup migrate`", figures)
    if version < LATEST:
        return Check(
            "schema",
            "fail",
            f"schema version {version}, this jobsup needs {LATEST}",
            "run `jobsup migrate` (safe while supervisors run)",
            figures,
        )
    if version > LATEST:
        return Check(
            "schema",
            "warn",
            f"schema version {version} is newer than this jobsup knows ({LATEST})",
            "upgrade jobsup here to the version that migrated the database",
            figures,
        )
    return Check("schema", "ok", f"schema version {version}, as this jobsup expects", figures=figures)


def _who(s: dict[str, Any]) -> str:
    parts = [s["state"]] if s["state"] else []
    if s["application_name"]:
        parts.append(f"application {s['application_name']!r}")
    if s["role"]:
        parts.append(f"role {s['role']}")
    if s["query_start"] is not None:
        parts.append(f"query started {s['query_start']:%Y-%m-%d %H:%M:%S %Z}")
    return f"pid {s['pid']}" + (f" ({', '.join(parts)})" if parts else "")


def _session_figures(s: dict[str, Any]) -> dict[str, Any]:
    figures = dict(s)
    figures["query_start"] = s["query_start"].isoformat() if s["query_start"] else None
    figures["idle_in_transaction"] = bool(s["state"] and s["state"].startswith("idle in transaction"))
    return figures


def check_xmin_horizon(sessions: list[dict[str, Any]], t: Thresholds) -> Check:
    holders = [s for s in sessions if s["holds_xmin"]]
    if not holders:
        return Check("xmin_horizon", "ok", "no session holds back vacuum", figures={"holders": []})
    # The threshold is a time: the holder to name is the longest-held of those whose age the server
    # shows, unless only the oldest horizon (by transactions) is hidden and no shown one crosses it.
    timed = sorted((h for h in holders if h["xact_age"] is not None), key=lambda h: -h["xact_age"])
    hidden_first = holders[0]["xact_age"] is None
    s = timed[0] if timed and (not hidden_first or over(timed[0]["xact_age"], t.max_xmin_age)) else holders[0]
    figures: dict[str, Any] = {"holders": [_session_figures(h) for h in holders], "oldest": _session_figures(s)}
    pid = s["pid"]
    if s["xact_age"] is None:
        # The server hides the times of other roles' sessions (or it is a walsender, which has none).
        kind = "a standby's hot_standby_feedback through walsender" if s["backend_type"] == "walsender" else "a session"
        return Check(
            "xmin_horizon",
            "ok",
            f"oldest horizon: {kind} {_who(s)}, {s['xmin_xids']:,} transactions old; its age is "
            "hidden from this role: grant it pg_monitor to check it against --max-xmin-age",
            figures=figures,
        )
    message = f"vacuum held back {format_age(s['xact_age'])} by {_who(s)}"
    if s["query"]:
        message += f": {s['query']}"
    if not over(s["xact_age"], t.max_xmin_age):
        return Check(
            "xmin_horizon", "ok", f"oldest horizon {format_age(s['xact_age'])} old, {_who(s)}", figures=figures
        )
    if figures["oldest"]["idle_in_transaction"]:
        action = (
            f"end it: SELECT pg_terminate_backend({pid}); then find the code that leaves a transaction "
            "open, and set idle_in_transaction_session_timeout so it cannot recur"
        )
    elif s["backend_type"] == "walsender":
        action = (
            "a standby's long query holds it through hot_standby_feedback: end that query, or lower "
            "max_standby_streaming_delay / turn hot_standby_feedback off on the standby"
        )
    else:
        action = (
            f"a long transaction or query: let it finish, or SELECT pg_cancel_backend({pid}) "
            f"(the query) / pg_terminate_backend({pid}) (the session); "
            "statement_timeout (and transaction_timeout, PostgreSQL 17+) bound them"
        )
    return Check("xmin_horizon", "warn", message, action, figures)


def check_idle_in_transaction(sessions: list[dict[str, Any]], t: Thresholds) -> Check:
    idle = [s for s in sessions if s["state"] and s["state"].startswith("idle in transaction")]
    idle.sort(key=lambda s: -(s["state_age"] or 0))
    figures = {"sessions": [_session_figures(s) for s in idle]}
    if not idle:
        return Check("idle_in_transaction", "ok", "no session is idle in a transaction", figures=figures)
    s = idle[0]
    past = [x for x in idle if over(x["state_age"], t.max_idle_in_transaction)]
    message = (
        f"{len(idle)} session{'s' if len(idle) != 1 else ''} idle in a transaction, the longest "
        f"{format_age(s['state_age'])}: {_who(s)}"
    )
    if not past:
        return Check("idle_in_transaction", "ok", message, figures=figures)
    pids = ", ".join(str(x["pid"]) for x in past[:5])
    return Check(
        "idle_in_transaction",
        "warn",
        message,
        f"end them: SELECT pg_terminate_backend(pid) for pid {pids}; then fix the application "
        "to commit or roll back, and set idle_in_transaction_session_timeout "
        "(ALTER DATABASE ... SET idle_in_transaction_session_timeout = '5min')",
        figures,
    )


def check_prepared(prepared: list[dict[str, Any]], t: Thresholds) -> Check:
    figures = {"prepared": prepared}
    if not prepared:
        return Check("prepared_transactions", "ok", "no prepared transaction", figures=figures)
    p = prepared[0]
    message = (
        f"{len(prepared)} prepared transaction{'s' if len(prepared) != 1 else ''}, the oldest "
        f"{p['gid']!r} of {p['owner']}, {format_age(p['age'])} old ({p['xmin_xids']:,} transactions)"
    )
    if not over(p["age"], t.max_xmin_age):
        return Check("prepared_transactions", "ok", message, figures=figures)
    return Check(
        "prepared_transactions",
        "warn",
        message,
        f"ask its transaction manager which way it went, then COMMIT PREPARED {p['gid']!r} or "
        f"ROLLBACK PREPARED {p['gid']!r} (as {p['owner']} or a superuser)",
        figures,
    )


def check_slots(slots: list[dict[str, Any]]) -> Check:
    figures = {"slots": slots}
    if not slots:
        return Check("replication_slots", "ok", "no replication slot holds xmin", figures=figures)
    inactive = [s for s in slots if not s["active"]]
    s = (inactive or slots)[0]
    held = ", ".join(
        f"{name} {s[key]:,} transactions old"
        for name, key in (("xmin", "xmin_xids"), ("catalog_xmin", "catalog_xmin_xids"))
        if s[key] is not None
    )
    message = (
        f"{len(slots)} slot{'s' if len(slots) != 1 else ''} hold xmin; "
        f"{'inactive' if not s['active'] else 'active'} {s['slot_type']} slot {s['slot_name']!r}: {held}"
    )
    if not inactive:
        return Check("replication_slots", "ok", message, figures=figures)
    return Check(
        "replication_slots",
        "warn",
        message,
        f"an inactive slot holds vacuum back and keeps all WAL since: restart its consumer, or if it "
        f"is gone for good SELECT pg_drop_replication_slot({s['slot_name']!r})",
        figures,
    )


def check_table(table: dict[str, Any], server: dict[str, Any], t: Thresholds, held_back: bool) -> Check:
    name = table["name"]
    live, dead = table["live_tuples"], table["dead_tuples"]
    ratio = dead_share(live, dead)
    vacuumed = "never vacuumed" if table["vacuum_age"] is None else f"last vacuum {format_age(table['vacuum_age'])} ago"
    parts = f", {table['tables']} partitions" if table["tables"] > 1 else ""
    message = (
        f"{live:,} live, {dead:,} dead ({ratio:.0%}), autovacuum at {table['vacuum_at']:,} dead, "
        f"{vacuumed}; {_bytes(table['table_bytes'])} + {_bytes(table['index_bytes'])} indexes{parts}"
    )
    figures = {**table, "dead_ratio": round(ratio, 4)}
    check = f"table {name}"
    if not (server["autovacuum"] and table["autovacuum_enabled"]):
        where = (
            "on this server (autovacuum = off)"
            if not server["autovacuum"]
            else f"for {name} (autovacuum_enabled = false)"
        )
        return Check(
            check,
            "warn",
            f"autovacuum is off {where}; {message}",
            f"turn it back on: nothing else removes the dead tuples of a queue's churn "
            f"(ALTER TABLE {name} RESET (autovacuum_enabled))",
            figures,
        )
    if not too_dead(live, dead, t):
        return Check(check, "ok", message, figures=figures)
    if held_back:
        action = "first end what holds vacuum back (the xmin_horizon line): vacuum cannot remove these until then"
    else:
        action = (
            f"vacuum is not keeping up: VACUUM (VERBOSE) {name}; then let autovacuum start sooner and "
            f"work faster on it, e.g. ALTER TABLE {name} SET (autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_vacuum_cost_limit = 2000)"
        )
    return Check(check, "warn", message, action, figures)


def check_notify(server: dict[str, Any], t: Thresholds) -> Check:
    usage = server["notify_usage"]
    message = f"{usage:.1%} of the NOTIFY queue in use"
    figures = {"usage": usage}
    if not over(usage, t.max_notify_usage):
        return Check("notify_queue", "ok", message, figures=figures)
    return Check(
        "notify_queue",
        "warn",
        message,
        "a session that LISTENs and stays in a long transaction keeps the queue from emptying: end it "
        "(see xmin_horizon and idle_in_transaction); once the queue is full every NOTIFY, so every "
        "enqueue, fails",
        figures,
    )


def check_connections(
    server: dict[str, Any], apps: list[dict[str, Any]], live_supervisors: int, t: Thresholds
) -> Check:
    used = sum(a["count"] for a in apps)
    available = server["max_connections"] - server["reserved_connections"]
    by_app = {a["application_name"]: a["count"] for a in apps}
    links = {link: by_app.get(f"jobsup {link}", 0) for link in SUPERVISOR_LINKS}
    consoles = by_app.get(CONSOLE_APPLICATION, 0)
    need = len(SUPERVISOR_LINKS)
    room = max(0, available - used) // need
    figures = {
        "used": used,
        "available": available,
        "max_connections": server["max_connections"],
        "reserved_connections": server["reserved_connections"],
        "live_supervisors": live_supervisors,
        "per_supervisor": need,
        "supervisor_connections": links,
        "consoles": consoles,
        "room_for_supervisors": room,
    }
    share = used / available if available > 0 else 1.0
    message = (
        f"{used} of {available} connections in use ({share:.0%}); jobsup: {live_supervisors} "
        f"supervisor{'s' if live_supervisors != 1 else ''} x {need} = {live_supervisors * need} at most, "
        f"{sum(links.values())} open, {consoles} console{'s' if consoles != 1 else ''}; "
        f"room for {room} more supervisor{'s' if room != 1 else ''}"
    )
    action = (
        f"raise max_connections (a restart), or put a pooler in front of the other clients; each "
        f"supervisor needs {need} (its listen connection needs a session, not a transaction pooler), "
        "its worker processes none"
    )
    if used >= available:
        return Check("connections", "fail", f"no connection left: {message}", action, figures)
    if over(share, t.max_connections_used):
        return Check("connections", "warn", message, action, figures)
    return Check("connections", "ok", message, figures=figures)


def check_supervisors(supervisors: list[dict[str, Any]], t: Thresholds) -> Check:
    stale = [s for s in supervisors if over(s["heartbeat_age"], t.stale_after)]
    live = len(supervisors) - len(stale)
    figures = {
        "live": live,
        "stale": [{k: s[k] for k in ("id", "host", "pid", "state", "heartbeat_age")} for s in stale],
    }
    message = f"{live} live supervisor{'s' if live != 1 else ''}"
    if not stale:
        return Check("supervisors", "ok", message, figures=figures)
    s = max(stale, key=lambda s: s["heartbeat_age"])
    message += (
        f"; {len(stale)} whose heartbeat stopped, e.g. {s['id']} (pid {s['pid']} on {s['host']}), "
        f"last beat {format_age(s['heartbeat_age'])} ago"
    )
    return Check(
        "supervisors",
        "warn",
        message,
        "a supervisor that died without cleaning up (or is stalled): check that process on its host; "
        "a live supervisor removes a dead one's row (one of its own host whose pid is gone 10 s after its "
        "last beat, any other 5 minutes after), and its running jobs come back when their leases expire "
        "(see orphaned_jobs)",
        figures,
    )


def check_unserved(unserved: list[Unserved]) -> Check:
    """Ready jobs that no live supervisor can run: their kind is handled by no app serving their queue."""
    figures = {"unserved": [u.to_json() for u in unserved]}
    if not unserved:
        return Check("unserved", "ok", "every ready job's kind has a live supervisor that can run it", figures=figures)
    worst = max(unserved, key=lambda u: u.age)
    more = f" (and {len(unserved) - 1} more kinds)" if len(unserved) > 1 else ""
    return Check(
        "unserved",
        "warn",
        worst.describe() + more,
        "start a supervisor whose app handles that kind on that queue (in a rolling deploy: the new release), "
        "or cancel the jobs: jobsup cancel --kind KIND --queue QUEUE",
        figures,
    )


def check_orphans(orphans: list[dict[str, Any]], live_supervisors: int) -> Check:
    jobs = sum(o["jobs"] for o in orphans)
    figures = {"jobs": jobs, "by_supervisor": orphans}
    if not orphans:
        return Check("orphaned_jobs", "ok", "every running job has a live supervisor", figures=figures)
    o = orphans[0]
    lease = o["lease_left"]
    when = (
        "no lease"
        if lease is None
        else f"lease expires in {format_age(lease)}"
        if lease >= 0
        else f"lease expired {format_age(-lease)} ago"
    )
    message = (
        f"{jobs} running job{'s' if jobs != 1 else ''} under no live supervisor; "
        f"{o['jobs']} of {o['locked_by']} (first id {o['first_id']}, {when})"
    )
    if live_supervisors == 0:
        action = (
            "no live supervisor runs a reaper: start one (`jobsup start`); it returns them once their leases expire"
        )
    else:
        action = "a live supervisor's reaper returns them to the queue when their leases expire, counting the attempt"
    return Check("orphaned_jobs", "warn", message, action, figures)


# --- running them ----------------------------------------------------------------------------------


def run_checks(conn: psycopg.Connection, thresholds: Thresholds = Thresholds()) -> Report:
    """Every check against `conn`'s database. Needs no privilege beyond reading the jobsup tables;
    without pg_monitor (or pg_read_all_stats) other roles' sessions show no age or state, which the
    server check says."""
    t = thresholds
    with conn.transaction():
        conn.execute(SQL["doctor_limits"], {"lock_timeout": LOCK_TIMEOUT, "statement_timeout": STATEMENT_TIMEOUT})
        (server,) = _rows(conn, "doctor_server")
        version = schema_version(conn)
        sessions = _rows(conn, "doctor_sessions", limit=SESSION_LIMIT)
        prepared = _rows(conn, "doctor_prepared")
        slots = _rows(conn, "doctor_slots")
        apps = _rows(conn, "doctor_connections")
        xmin = check_xmin_horizon(sessions, t)
        checks = [
            check_server(server),
            check_schema(version),
            xmin,
            check_idle_in_transaction(sessions, t),
            check_prepared(prepared, t),
            check_slots(slots),
        ]
        if version == 0:
            live = 0
        else:
            try:
                with conn.transaction():
                    tables = _rows(conn, "doctor_tables")
            except psycopg.errors.LockNotAvailable:
                checks.append(
                    Check(
                        "tables",
                        "warn",
                        f"a jobsup table stayed locked for {LOCK_TIMEOUT} (an ALTER TABLE, VACUUM FULL or REINDEX?)",
                        "see who holds it: SELECT * FROM pg_locks WHERE relation::regclass::text "
                        "LIKE 'jobsup.%' AND granted",
                    )
                )
                tables = []
            checks += [check_table(table, server, t, held_back=xmin.level != "ok") for table in tables]
            supervisors = _rows(conn, "supervisors")
            live = sum(1 for s in supervisors if not over(s["heartbeat_age"], t.stale_after))
        checks.append(check_notify(server, t))
        checks.append(check_connections(server, apps, live, t))
        if version:
            checks.append(check_supervisors(supervisors, t))
            checks.append(check_orphans(_rows(conn, "doctor_orphaned_jobs", stale_after=t.stale_after), live))
            checks.append(check_unserved(unserved(conn, t.stale_after)))
    return Report(checks, t)
