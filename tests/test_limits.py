"""Limits without supervisors: the rate arithmetic on a fixed clock, claim_limited's choices, what wins
between apps and operators, bad input, jobsup.testing.drain, and an earlier release's statements
against the migrated schema. tests/test_limits_supervisors.py holds them across real supervisors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

import jobsup
from jobsup import App, Job
from jobsup.db import lifecycle
from jobsup.db.sql import load
from jobsup.errors import BadInput
from jobsup.limits import Limits, Rate
from jobsup.ops import limits
from jobsup.testing import drain

from .helpers import jobsup as run_jobsup
from .helpers import refused_all, wait_for
from .supervisor_helpers import status_counts, went_on_past

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PREVIOUS_RELEASE = Path(__file__).parent / "previous_release"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def room(conn, tat, now, rate, period, burst) -> int:
    return conn.execute("SELECT jobsup.rate_room(%s, %s, %s, %s, %s)", [tat, now, rate, period, burst]).fetchone()[0]


# --- the rate's arithmetic, on a fixed clock -----------------------------------------------------


def test_a_fresh_rate_allows_its_burst_and_then_one_start_per_interval(conn):
    # 10/s with a burst of 3: three at once, then one every 100 ms, never a window's edge of double.
    assert room(conn, None, at(0), 10, 1.0, 3) == 3
    tat = conn.execute("SELECT jobsup.rate_after(NULL, %s, 3, 10, 1.0)", [at(0)]).fetchone()[0]
    assert tat == at(0.3)
    assert room(conn, tat, at(0), 10, 1.0, 3) == 0
    assert room(conn, tat, at(0.099), 10, 1.0, 3) == 0
    assert room(conn, tat, at(0.1), 10, 1.0, 3) == 1
    assert room(conn, tat, at(0.3), 10, 1.0, 3) == 3  # a quiet spell gives the burst back
    assert room(conn, tat, at(60), 10, 1.0, 3) == 3  # and no more than the burst
    nxt = conn.execute("SELECT jobsup.rate_next(%s, %s, 10, 1.0, 3)", [tat, at(0)]).fetchone()[0]
    assert nxt == at(0.1)


def simulate(conn, rate: int, burst: int, every: float, seconds: float) -> list[float]:
    """The starts of a claimer that asks every `every` seconds for as many as the rate allows."""
    starts: list[float] = []
    tat = None
    for step in range(int(seconds / every)):
        now = at(step * every)
        n = room(conn, tat, now, rate, 1.0, burst)
        if n:
            tat = conn.execute("SELECT jobsup.rate_after(%s, %s, %s, %s, 1.0)", [tat, now, n, rate]).fetchone()[0]
            starts += [step * every] * n
    return starts


def test_starts_over_any_second_stay_within_rate_plus_burst(conn):
    """A claimer asking every 7 ms (so nearly every claim comes late for an interval of 10 ms): in every
    window of one second, at most rate + burst starts; and the lateness is not lost, so the starts come
    at the rate."""
    for burst in (1, 5):
        starts = simulate(conn, 100, burst, 0.007, 20.0)
        worst = max(sum(1 for s in starts if t <= s < t + 1.0) for t in starts)
        assert worst <= 100 + burst
        assert len(starts) == pytest.approx(100 * 20, abs=burst + 1)


def test_a_claim_an_interval_late_or_more_restarts_the_schedule(conn):
    """After a quiet spell the schedule restarts from the claim: no catching up on starts not made."""
    tat = conn.execute("SELECT jobsup.rate_after(NULL, %s, 1, 10, 1.0)", [at(0)]).fetchone()[0]
    assert tat == at(0.1)
    assert room(conn, tat, at(5), 10, 1.0, 1) == 1  # not the 49 starts missed meanwhile
    assert conn.execute("SELECT jobsup.rate_after(%s, %s, 1, 10, 1.0)", [tat, at(5)]).fetchone()[0] == at(5.1)
    # Late by less than an interval: the next start is due an interval after the last was due.
    assert conn.execute("SELECT jobsup.rate_after(%s, %s, 1, 10, 1.0)", [tat, at(0.15)]).fetchone()[0] == at(0.2)


def test_rates_parse_and_print():
    assert Rate.parse("100/m") == Rate(100, 60.0, 1)
    assert Rate.parse("5/s", burst=5) == Rate(5, 1.0, 5)
    assert Rate.parse("6000 / 10 minutes").interval == pytest.approx(0.1)
    assert str(Rate.parse("2/hours")) == "2/h"
    assert str(Limits.of("k", concurrency="3", key_rate="10/s")) == "concurrency 3, key_rate 10/s"


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"concurrency": 0}, "concurrency of kind 'k' must be a whole number from 1 up, not 0"),
        ({"concurrency": -1}, "not -1"),
        ({"concurrency": 1.5}, "not 1.5"),
        ({"concurrency": "x"}, "not 'x'"),
        ({"concurrency": True}, "not True"),
        ({"rate": "abc"}, "rate of kind 'k' must be a number of starts per period"),
        ({"rate": "0/s"}, "allows no start"),
        ({"rate": "5/fortnight"}, "not '5/fortnight'"),
        ({"rate": "5/ms"}, "not '5/ms'"),
        ({"rate": "5/s", "burst": 0}, "burst of rate of kind 'k' must be a whole number"),
        ({"burst": 2}, "a burst needs a rate"),
        ({"key_concurrency": 0}, "key_concurrency of kind 'k'"),
        ({"key_rate": "1/0s"}, "allows no start"),
    ],
)
def test_bad_limits_are_refused_naming_the_value(given, says):
    with pytest.raises(BadInput, match=None) as refused:
        Limits.of("k", **given)
    assert says in str(refused.value)
    with pytest.raises(BadInput):
        App().handler("k", **given)


def test_a_key_function_that_fails_is_the_enqueues_error_naming_the_handler(conn):
    app = App()

    @app.handler("charge", key_concurrency=1, key=lambda payload: payload["account"])
    def charge(job: Job) -> None: ...

    @app.handler("numbered", key=lambda payload: payload["n"])
    def numbered(job: Job) -> None: ...

    with pytest.raises(BadInput, match="the key function of handler 'charge' raised KeyError: 'account'"):
        app.enqueue(conn, "charge", {})
    with pytest.raises(BadInput, match="the key function of handler 'numbered' returned int 7, not a string"):
        app.enqueue(conn, "numbered", {"n": 7})
    with pytest.raises(BadInput, match="over the limit of 200"):
        app.enqueue(conn, "charge", {"account": "a" * 201})
    with pytest.raises(BadInput, match="key of a 'charge' job must be a non-empty string"):
        jobsup.enqueue(conn, "charge", key="")
    assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0] == 0
    job_id = app.enqueue(conn, "charge", {"account": "acme"})
    given = app.enqueue(conn, "charge", {"account": "acme"}, key="override")
    keys = dict(conn.execute("SELECT id, key FROM jobsup.jobs").fetchall())
    assert keys == {job_id: "acme", given: "override"}


def test_bad_limit_commands_are_one_line_exit_2_and_write_nothing(dsn, conn):
    refused_all(
        dsn,
        [
            (["limit", "k", "--concurrency", "0"], "concurrency of kind 'k' must be a whole number from 1 up"),
            (["limit", "k", "--concurrency", "-1"], "not '-1'"),
            (["limit", "k", "--concurrency", "1.5"], "not '1.5'"),
            (["limit", "k", "--concurrency", "x"], "not 'x'"),
            (["limit", "k", "--rate", "abc"], "must be a number of starts per period"),
            (["limit", "k", "--rate", "0/s"], "allows no start"),
            (["limit", "k", "--rate", "5/fortnight"], "5/fortnight"),
            (["limit", " k", "--concurrency", "1"], "a kind is a non-empty name"),
            (["limit", "", "--concurrency", "1"], "a kind is a non-empty name"),
            (["limit", "--concurrency", "1"], "name the KIND"),
            (["limit", "-", "--concurrency", "1"], "'-' is not a kind"),
            (["enqueue", "-"], "'-' is not a kind (for jobs on standard input: jobsup enqueue --file -)"),
            (["limit", "k", "--reset", "--remove"], "one of them"),
            (["enqueue", "k", "--key", "x" * 201], "over the limit of 200"),
        ],
    )
    assert conn.execute("SELECT count(*) FROM jobsup.limits").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0] == 0


# --- claim_limited ---------------------------------------------------------------------------


def claim(conn, want=10, kinds=("k",), queues=("default",), by="sup-a"):
    return lifecycle.claim_limited(conn, list(kinds), list(queues), want, by, 30)


def test_a_kind_at_its_limit_is_left_without_reading_its_backlog(conn):
    limits.set_limits(conn, "k", "test", concurrency=2)
    jobsup.enqueue_many(conn, [{"kind": "k"}] * 5000)
    first, _ = claim(conn)
    assert len(first) == 2
    conn.execute("SELECT pg_stat_reset()")
    plan = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM jobsup.claim_limited('{k}', '{default}', 10, 's', 30)"
    ).fetchone()[0]
    # The function's own statements are not in the plan; its buffers are: a handful, not thousands.
    buffers = plan[0]["Plan"].get("Shared Hit Blocks", 0) + plan[0]["Plan"].get("Shared Read Blocks", 0)
    assert buffers < 50, buffers
    assert claim(conn)[0] == []
    # The plain claim does not see them at all: they are not in the ready index.
    assert lifecycle.claim(conn, ["default"], 10, "sup-a", 30) == []


@pytest.mark.parametrize("jobs", [6, 2000])
def test_a_claim_never_takes_more_than_the_room_whatever_the_plan(conn, jobs):
    """Jobs without a key are taken all at once: as many as there is room for, never more, with the
    table's statistics fresh or missing (a subquery with LIMIT ... SKIP LOCKED that a plan runs more
    than once takes more each time)."""
    limits.set_limits(conn, "k", "test", concurrency=2)
    jobsup.enqueue_many(conn, [{"kind": "k"}] * jobs)
    if jobs > 100:
        conn.execute("ANALYZE jobsup.jobs")
    # Past its fifth run in a session, a PL/pgSQL statement may switch to a generic plan: many rounds.
    for _ in range(min(jobs // 2, 20)):
        taken, _ = claim(conn, want=10)
        assert len(taken) == 2
        claim(conn, want=10, by="another")  # nothing: the room is taken
        lifecycle.complete(conn, [(j.id, j.attempts) for j in taken], "sup-a")
    assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'running'").fetchone()[0] == 0


def test_priority_first_then_keys_take_turns(conn):
    limits.set_limits(conn, "k", "test", concurrency=100)
    jobsup.enqueue_many(conn, [{"kind": "k", "key": "big"}] * 50)
    jobsup.enqueue_many(conn, [{"kind": "k", "key": f"small-{n}"} for n in range(3)])
    urgent = jobsup.enqueue(conn, "k", key="big", priority=5)
    jobs, _ = claim(conn, want=5)
    assert jobs[0].id == urgent
    assert sorted(j.key for j in jobs[1:]) == ["big", "small-0", "small-1", "small-2"]
    # The next claim goes on after the last key served, so the big key cannot take every turn.
    jobs, _ = claim(conn, want=2)
    assert [j.key for j in jobs] == ["big", "big"]


def test_per_key_concurrency_and_rate(conn):
    limits.set_limits(conn, "k", "test", key_concurrency=1)
    jobsup.enqueue_many(conn, [{"kind": "k", "key": key} for key in "aabbc"])
    jobs, _ = claim(conn)
    assert sorted(j.key for j in jobs) == ["a", "b", "c"]
    assert claim(conn)[0] == []
    lifecycle.complete(conn, [(jobs[0].id, 1)], "sup-a")
    [again], _ = claim(conn)
    assert again.key == jobs[0].key

    limits.set_limits(conn, "r", "test", key_rate="1/h")
    jobsup.enqueue_many(conn, [{"kind": "r", "key": "x"}] * 2)
    [one], wake = claim(conn, kinds=["r"])
    nothing, wake = claim(conn, kinds=["r"])
    assert nothing == [] and wake is not None
    assert timedelta(minutes=59) < wake - one.started_at <= timedelta(hours=1)
    assert conn.execute("SELECT attempts FROM jobsup.jobs WHERE kind = 'r' AND status = 'queued'").fetchone() == (0,)


# --- declarations and operators ------------------------------------------------------------------


def test_the_last_app_declared_wins_and_an_operators_values_win_over_any_app(conn):
    one = limits.declare(conn, {"k": Limits(concurrency=3)}, ["k"], "sup-1")
    assert one[0].after == Limits(concurrency=3)
    two = limits.declare(conn, {"k": Limits(concurrency=5)}, ["k"], "sup-2")
    assert (two[0].before, two[0].after) == (Limits(concurrency=3), Limits(concurrency=5))
    limits.set_limits(conn, "k", "ann@ops", concurrency=1)
    three = limits.declare(conn, {"k": Limits(concurrency=8)}, ["k"], "sup-3")
    assert three[0].after == Limits(concurrency=1) and three[0].set_by == "ann@ops"
    assert limits.reset(conn, "k", "ann@ops").after == Limits(concurrency=8)
    # An app that handles the kind and declares nothing for it now: the kind is no longer limited.
    limits.declare(conn, {}, ["k"], "sup-4")
    assert limits.in_force(conn) == []


def test_a_limit_set_or_removed_moves_the_kinds_live_jobs_between_the_claims(conn):
    ids = jobsup.enqueue_many(conn, [{"kind": "k"}] * 3)
    [running] = lifecycle.claim(conn, ["default"], 1, "sup-a", 30)
    limits.set_limits(conn, "k", "test", concurrency=2)
    marked = conn.execute("SELECT count(*) FROM jobsup.jobs WHERE limited").fetchone()[0]
    assert marked == 3
    # The job claimed before the limit counts against it.
    assert len(claim(conn)[0]) == 1
    assert running.id in ids
    after = jobsup.enqueue(conn, "k")
    assert conn.execute("SELECT limited FROM jobsup.jobs WHERE id = %s", [after]).fetchone() == (True,)
    limits.set_limits(conn, "k", "test", concurrency=None)
    assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE limited").fetchone()[0] == 0
    assert [j.id for j in lifecycle.claim(conn, ["default"], 10, "sup-a", 30)] == [ids[2], after]


def test_jobsup_limit_lists_sets_resets_and_removes(dsn, conn):
    assert run_jobsup("limit", "--dsn", dsn).stdout.strip() == "no limits"
    jobsup.enqueue(conn, "mail")  # a kind that exists: no --new-kind needed
    done = run_jobsup("limit", "mail", "--concurrency", "3", "--rate", "100/m", "--dsn", dsn)
    assert done.returncode == 0 and "mail: concurrency 3, rate 100/m" in done.stdout
    listed = run_jobsup("limit", "--json", "--dsn", dsn)
    [row] = __import__("json").loads(listed.stdout)
    assert row["limits"] == {"concurrency": 3, "rate": "100/m", "burst": 1} and row["set_by"]
    assert "rate none" not in run_jobsup("limit", "mail", "--rate", "none", "--dsn", dsn).stdout
    assert limits.in_force(conn) == ["mail"]
    assert run_jobsup("limit", "mail", "--remove", "--dsn", dsn).returncode == 0
    assert limits.in_force(conn) == []


def test_jobsup_limit_refuses_a_kind_nothing_knows_without_new_kind_and_leaves_no_row_once_removed(dsn, conn):
    # A typo of a kind: no handler declares it, no job has it. One line, exit 2, nothing written.
    done = run_jobsup("limit", "chargee", "--concurrency", "1", "--dsn", dsn)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "no handler declares kind 'chargee' and no job has it" in line and "--new-kind" in line, line
    assert conn.execute("SELECT count(*) FROM jobsup.limits").fetchone() == (0,)
    # Known from a job, from a finished one, from a live supervisor's app, from an app's declaration.
    jobsup.enqueue(conn, "charge")
    assert run_jobsup("limit", "charge", "--concurrency", "1", "--dsn", dsn).returncode == 0
    conn.execute("INSERT INTO jobsup.kind_totals (kind, slot, done) VALUES ('report', 0, 1)")
    conn.execute(
        "INSERT INTO jobsup.supervisors (id, host, pid, version, queues, procs, kinds) "
        "VALUES ('sup-x', 'h', 1, 'v', '{default}', 1, '{export}')"
    )
    limits.declare(conn, {"paced": Limits.of("paced", rate="5/s")}, ["paced"], "app@h")
    for known in ("report", "export", "paced"):
        assert limits.kind_known(conn, known), known
    # Asked for by name: a kind whose first job is still to come.
    done = run_jobsup("limit", "chargee", "--concurrency", "1", "--new-kind", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    # --remove and --reset of a kind no app limits leave no row: the list no longer shows it.
    assert run_jobsup("limit", "chargee", "--remove", "--dsn", dsn).returncode == 0
    assert run_jobsup("limit", "charge", "--concurrency", "2", "--dsn", dsn).returncode == 0
    assert run_jobsup("limit", "charge", "--reset", "--dsn", dsn).returncode == 0
    assert [r[0] for r in conn.execute("SELECT kind FROM jobsup.limits ORDER BY kind")] == ["paced"]
    assert "chargee" not in run_jobsup("limit", "--dsn", dsn).stdout
    # Removed over an app's declaration: the row stays, as the operator's "none" wins until --reset.
    assert run_jobsup("limit", "paced", "--remove", "--dsn", dsn).returncode == 0
    assert conn.execute("SELECT set_by IS NOT NULL FROM jobsup.limits WHERE kind = 'paced'").fetchone() == (True,)


# --- jobsup.testing.drain ------------------------------------------------------------------------

drained_app = App()


@drained_app.handler("paced", rate="20/s")
def paced(job: Job) -> None: ...


@drained_app.handler("one_per_account", key_concurrency=1, key=lambda p: p["account"])
def one_per_account(job: Job) -> None: ...


def test_drain_honours_limits(conn):
    """Without a supervisor ever having run: drain records the app's limits, as a supervisor does."""
    jobsup.enqueue_many(conn, [{"kind": "paced"}] * 10)
    for n in range(4):
        drained_app.enqueue(conn, "one_per_account", {"account": f"a{n % 2}"})
    ran = drain(drained_app, conn)
    assert len(ran) == 14 and {r.outcome for r in ran} == {"done"}
    starts = [r[0] for r in conn.execute("SELECT started_at FROM jobsup.jobs WHERE kind = 'paced' ORDER BY started_at")]
    # 20/s, a burst of 1: the k-th start no sooner than k intervals of 50 ms after the first (a late
    # start keeps the schedule, so two starts may come closer than an interval, never ahead of it).
    ahead = [(s - starts[0]).total_seconds() - k * 0.05 for k, s in enumerate(starts)]
    assert min(ahead) >= -0.001


# --- upgrading: an earlier release's statements against this schema --------------------------------


# The parameters of the previous release's claim, as its supervisor sends them.
OLD_CLAIM = {
    "queues": ["default"],
    "after_priorities": [None],
    "after_run_ats": [None],
    "after_ids": [None],
    "limit": 10,
    "locked_by": "old",
    "lease": 30,
    "kinds": None,
}


def previous(name: str) -> str:
    return load((PREVIOUS_RELEASE / "lifecycle.sql").read_text())[name]


def test_the_previous_releases_claim_is_refused_and_its_writes_still_free_slots(conn):
    """A supervisor of the release before limits claims with a statement that knows none: the schema
    refuses it (its claim loop ends with this error and it stops). Its outcome writes and releases
    still work, and free the slots of the limited jobs it held."""
    limits.set_limits(conn, "k", "test", concurrency=1)
    jobsup.enqueue_many(conn, [{"kind": "k"}, {"kind": "k"}, {"kind": "free"}])
    with pytest.raises(psycopg.Error) as refused:
        conn.execute(previous("claim"), OLD_CLAIM)
    assert refused.value.sqlstate == lifecycle.CLAIM_REFUSED
    assert "run a jobsup whose schema is version 8 or later" in str(refused.value)
    assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'running'").fetchone() == (0,)
    # A job it held from before the migration: its completion frees the slot.
    [held], _ = claim(conn, by="old")
    assert claim(conn)[0] == []
    conn.execute(previous("complete"), {"ids": [held.id], "attempts": [1], "locked_by": "old", "return_values": None})
    assert len(claim(conn)[0]) == 1


def test_the_previous_releases_claim_of_jobs_of_no_limited_kind_goes_through(conn):
    """What the schema refuses is a claim that would break a limit: the release before limits claims
    the jobs of kinds without one as it always did, and the first claim of its that takes a limited
    job is refused whole (JS001): nothing of it is claimed."""
    limits.set_limits(conn, "k", "test", concurrency=1)
    free = jobsup.enqueue_many(conn, [{"kind": "free"}] * 2)
    claimed = conn.execute(previous("claim"), OLD_CLAIM).fetchall()
    assert sorted(row[0] for row in claimed) == sorted(free)
    later = jobsup.enqueue_many(conn, [{"kind": "free"}, {"kind": "k"}])
    with pytest.raises(psycopg.Error) as refused:
        conn.execute(previous("claim"), OLD_CLAIM)
    assert refused.value.sqlstate == lifecycle.CLAIM_REFUSED
    statuses = conn.execute("SELECT status FROM jobsup.jobs WHERE id = ANY(%s)", [later]).fetchall()
    assert statuses == [("queued",), ("queued",)]


# --- across a real supervisor ------------------------------------------------------------------------


def test_a_supervisor_declares_its_apps_limits_before_its_first_claim(conn, dsn, start):
    """Jobs of a kind the app limits, queued before any supervisor ever ran: the first claim already
    obeys the limit (the declaration precedes it), and the supervisor logs what it declared."""
    from tests.apps.limited import SCHEMA

    conn.execute(SCHEMA)
    jobsup.enqueue_many(conn, [{"kind": "three", "payload": {"seconds": 0.3}}] * 6)
    sup = start(procs=6, app="tests.apps.limited:app", env={"JOBSUP_LIMITS_DSN": dsn})
    sup.wait_ready()
    sup.wait_log("limit.declared")
    wait_for(lambda: status_counts(conn).get("done") == 6, timeout=30, message="6 jobs done")
    assert max_overlap(conn) == 3


def max_overlap(conn) -> int:
    """The most runs of limit_runs in progress at one instant (an end before a start at a tie)."""
    return conn.execute(
        "WITH ev AS (SELECT started AS t, 1 AS d FROM limit_runs UNION ALL SELECT ended, -1 FROM limit_runs)"
        " SELECT max(s) FROM (SELECT sum(d) OVER (ORDER BY t, d) AS s FROM ev) x"
    ).fetchone()[0]


def test_a_supervisor_whose_claim_protocol_is_too_old_stops_claiming_and_says_why(conn, dsn, start):
    """What a later release's migration does to this one: the schema records a newer claim protocol;
    within a heartbeat the supervisor stops claiming, logs why, and goes on finishing what it holds."""
    sup = start(procs=1, app="tests.apps.limited:app", env={"JOBSUP_LIMITS_DSN": dsn})
    sup.wait_ready()
    conn.execute("UPDATE jobsup.compat SET oldest = %s, why = 'a test' WHERE name = 'claim'", [9])
    sup.wait_log("claim.refused")
    assert "requires claim protocol 9, this release speaks 8: a test" in sup.log()
    job_id = jobsup.enqueue(conn, "free")
    went_on_past(conn, sup, 1.0)  # its NOTIFY and a poll came and went: no claim
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone() == ("queued",)
    assert sup.stop() == 0


def test_a_supervisor_whose_workers_are_busy_takes_no_slot_from_one_whose_workers_are_idle(conn, dsn, start):
    """Supervisor A's one worker runs a long job of another kind; B's two are idle. Limited jobs arrive
    (limit 2): B runs both at once, and A holds no slot in its prefetch meanwhile."""
    from tests.apps.limited import SCHEMA

    conn.execute(SCHEMA)
    env = {"JOBSUP_LIMITS_DSN": dsn}
    busy = start(procs=1, app="tests.apps.limited:app", env=env)
    busy.wait_ready()
    long_one = jobsup.enqueue(conn, "free", {"seconds": 15})
    wait_for(lambda: conn.execute("SELECT count(*) FROM limit_runs").fetchone()[0] == 1, message="the long job")
    idle = start(procs=2, app="tests.apps.limited:app", env=env)
    idle.wait_ready()
    limits.set_limits(conn, "per_key", "test", concurrency=2)
    jobsup.enqueue_many(conn, [{"kind": "per_key", "payload": {"seconds": 0.5}, "key": f"k{n}"} for n in range(4)])
    wait_for(lambda: status_counts(conn).get("done", 0) >= 4, timeout=20, message="the limited jobs")
    holders = conn.execute("SELECT DISTINCT locked_by FROM jobsup.jobs WHERE kind = 'per_key'").fetchall()
    assert {h for (h,) in holders} == {idle_id(conn, idle)}
    assert conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", [long_one]).fetchone() == ("running",)
    assert max_overlap(conn) - 1 == 2  # the long job and two limited ones at once


def idle_id(conn, sup) -> str:
    return conn.execute("SELECT id FROM jobsup.supervisors WHERE pid = %s", [sup.pid]).fetchone()[0]


def test_a_supervisor_refused_mid_stream_finishes_what_it_holds_and_claims_no_more(conn, dsn, start):
    """A later schema that requires a newer claim protocol, applied while limited jobs flow: the
    supervisor's claims (those sent with its outcome writes too) are refused; it says why, stops
    claiming, and every job it had claimed still ends done."""
    from tests.apps.limited import SCHEMA

    conn.execute(SCHEMA)
    sup = start(procs=3, app="tests.apps.limited:app", env={"JOBSUP_LIMITS_DSN": dsn})
    sup.wait_ready()
    jobsup.enqueue_many(conn, [{"kind": "three", "payload": {"seconds": 0.05}}] * 400)
    wait_for(lambda: status_counts(conn).get("done", 0) >= 20, message="jobs flowing")
    with conn.transaction():
        conn.execute("DROP TRIGGER jobs_claim_protocol ON jobsup.jobs")
        conn.execute(
            "CREATE TRIGGER jobs_claim_protocol BEFORE UPDATE OF status ON jobsup.jobs FOR EACH ROW"
            " WHEN (NEW.status = 'running' AND OLD.status = 'queued'"
            " AND coalesce(nullif(current_setting('jobsup.claim_protocol', true), ''), '0')::int < 9)"
            " EXECUTE FUNCTION jobsup.refuse_old_claim()"
        )
    sup.wait_log("claim.refused")
    wait_for(lambda: status_counts(conn).get("running", 0) == 0, message="what it held, finished")
    counts = status_counts(conn)
    assert counts.get("dead", 0) == 0 and counts["done"] + counts["queued"] == 400
    done = counts["done"]
    went_on_past(conn, sup, 0.5)
    assert status_counts(conn)["done"] == done  # and nothing more claimed


def test_a_mistaken_rate_corrected_does_not_hold_the_kind_for_its_interval(conn):
    limits.set_limits(conn, "k", "ann@ops", rate="1/d", key_rate="1/d")
    jobsup.enqueue_many(conn, [{"kind": "k", "key": "a"}] * 3)
    assert len(claim(conn)[0]) == 1
    assert claim(conn)[0] == []  # a day to wait
    limits.set_limits(conn, "k", "ann@ops", rate="10/s", key_rate="10/s")
    # The corrected rate's interval (0.1 s) by the database's clock, not the mistaken one's day.
    assert len(wait_for(lambda: claim(conn)[0], timeout=5, interval=0.02, message="a claim at 10/s")) == 1


def test_resetting_a_kind_nobody_limited_is_refused(conn):
    with pytest.raises(BadInput, match="kind 'nope' has no limits to reset"):
        limits.reset(conn, "nope", "ann@ops")
    assert conn.execute("SELECT count(*) FROM jobsup.limits").fetchone() == (0,)


def test_the_ready_index_built_beforehand_is_kept_by_the_migration(empty_dsn):
    """The upgrade procedure for a large table (docs/operations/upgrading.md): the column and the index
    built beforehand without blocking, then `jobsup migrate`, which keeps them."""
    from jobsup.db import migrate as migrations

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA jobsup")
        conn.execute(migrations.SQL["migrations_table"])
        for migration in migrations.available():
            if migration.version < 8:
                conn.execute(migration.sql.encode())
                conn.execute(migrations.SQL["migration_done"], {"version": migration.version, "name": migration.name})
        conn.execute("INSERT INTO jobsup.jobs (kind) VALUES ('k')")  # as the previous release enqueues
        conn.execute("ALTER TABLE jobsup.jobs ADD COLUMN IF NOT EXISTS limited boolean NOT NULL DEFAULT false")
        conn.execute(
            "CREATE INDEX CONCURRENTLY jobs_ready_v8_idx ON jobsup.jobs (queue, priority DESC, run_at, id)"
            " WHERE status = 'queued' AND NOT limited"
        )
        assert [m.version for m in migrations.migrate(conn)] == list(range(8, migrations.LATEST + 1))
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'jobsup'")}
        assert "jobs_ready_idx" in indexes and "jobs_ready_v8_idx" not in indexes
        assert len(lifecycle.claim(conn, ["default"], 10, "sup", 30)) == 1


def test_a_limit_change_that_postgresql_aborts_for_a_deadlock_is_tried_again(conn, dsn):
    """A change of a kind's limits locks its limits row, then its live jobs (limit_mark_jobs); a running
    supervisor's write may hold a job and want the limits row. Here a transaction plays that write: it
    holds the job, and asks for the limits row once the change waits for the job. PostgreSQL aborts the
    change, which waited first (deadlock_timeout later), and `jobsup limit` tries again: exit 0. (It
    once failed so, "database error: deadlock detected", on a drain of four supervisors.)"""
    import subprocess
    import sys
    import threading

    from .helpers import ROOT, cli_env

    (job_id,) = jobsup.enqueue_many(conn, [{"kind": "contended"}])
    limits.set_limits(conn, "contended", "test", concurrency=2)
    assert conn.execute("SELECT limited FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone() == (True,)
    with psycopg.connect(dsn) as writer:
        writer.execute("SELECT 1 FROM jobsup.jobs WHERE id = %s FOR UPDATE", (job_id,))
        change = subprocess.Popen(
            [sys.executable, "-m", "jobsup", "limit", "contended", "--remove", "--dsn", dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            cwd=ROOT,
        )
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE '%%UPDATE jobsup.jobs SET limited%%'"
        )
        wait_for(
            lambda: conn.execute(waiting).fetchone()[0] == 1 or change.poll() is not None,
            20,
            message="the change waiting for the job",
        )
        assert change.poll() is None, change.communicate()
        got_row = threading.Event()

        def want_the_limits_row() -> None:
            rows = writer.execute("SELECT 1 FROM jobsup.limits WHERE kind = 'contended' FOR UPDATE").fetchall()
            assert rows == [(1,)]
            got_row.set()

        thread = threading.Thread(target=want_the_limits_row)
        thread.start()
        thread.join(30)
        assert got_row.is_set()  # the change was aborted, and let the row go
    out, err = change.communicate(timeout=30)  # the writer's transaction ended: the change's next try
    assert change.returncode == 0, err
    assert conn.execute("SELECT limited FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone() == (False,)
    assert conn.execute("SELECT count(*) FROM jobsup.limits WHERE kind = 'contended'").fetchone() == (0,)
