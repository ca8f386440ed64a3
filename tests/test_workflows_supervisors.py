"""Workflows under real `jobsup start` supervisors: a fan-out of 1,000 and its fan-in while supervisors
are SIGKILLed, a chain's order and the time from a parent's end to its child's start, a workflow through
PgBouncer in transaction mode, and one workflow ending alike under jobsup.testing.drain and under a
supervisor. Order is read from the rows the handlers of tests/apps/flows.py write to flow_runs and from
jobsup.jobs, both on the database's clock, never from logs; run with -s to see the figures."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Sequence

import psycopg
import pytest

from jobsup import Workflow, client
from jobsup.testing import drain

from .apps.flows import RUNS_TABLE, app
from .helpers import wait_for
from .supervisor_helpers import Supervisor, alive

APP = "tests.apps.flows:app"
# The floor is 300ms. A killed supervisor's jobs come back 2 s after their last renewal: long enough
# that no live run of a member (30 ms) outlives it, short enough for several kills within a test.
LEASE = ["--lease", "2s"]
POOLED = {"JOBSUP_POOLER": "transaction"}


@pytest.fixture
def runs(conn: psycopg.Connection, dsn: str, monkeypatch: pytest.MonkeyPatch) -> psycopg.Connection:
    """The flow_runs table; JOBSUP_DSN for the handlers a drain runs in this process."""
    conn.execute(RUNS_TABLE)
    monkeypatch.setenv("JOBSUP_DSN", dsn)
    return conn


def launch(start, dsn: str, *flags: str, procs: int = 2, handlers_dsn: str | None = None, env=None) -> Supervisor:
    """A supervisor of the flows app; its handlers reach the database at `handlers_dsn` (default `dsn`)."""
    return start(*flags, procs=procs, app=APP, env={"JOBSUP_DSN": handlers_dsn or dsn, **(env or {})})


def ready(sup: Supervisor, timeout: float = 90) -> None:
    # Several supervisors and their workers importing at once on two cores: slower than the default 20 s.
    sup.wait_log("supervisor.started", timeout=timeout)
    sup.wait_log("app.loaded", timeout=timeout)


def counts(conn: psycopg.Connection, workflow_id: int | None = None) -> dict[str, int]:
    return dict(
        conn.execute(
            "SELECT status, count(*) FROM jobsup.jobs WHERE %(w)s::bigint IS NULL OR workflow_id = %(w)s GROUP BY 1",
            {"w": workflow_id},
        ).fetchall()
    )


def wait_ended(conn: psycopg.Connection, workflow_id: int | None, timeout: float, sups: Sequence[Supervisor]) -> float:
    """Wait until no job (of the workflow) is waiting, queued or running; how long that took."""
    began = time.monotonic()

    def ended() -> bool:
        found = counts(conn, workflow_id)
        return bool(found) and not found.keys() & {"waiting", "queued", "running"}

    try:
        wait_for(ended, timeout=timeout, interval=0.1, message="every job of the workflow ended")
    except AssertionError as exc:
        logs = "\n".join(s.log()[-3000:] for s in sups)
        raise AssertionError(f"{exc}: {counts(conn, workflow_id)}\n{logs}") from None
    return time.monotonic() - began


def early_starts(conn: psycopg.Connection) -> tuple[list[tuple], int]:
    """Handler starts of a job at or before the end (done_at) of one of its parents, or while that parent
    has none; and how many (start, parent) pairs were looked at: a check that looked at none proves
    nothing."""
    rows = conn.execute(
        "SELECT r.job_id, r.attempt, d.parent_id, r.at, p.done_at, p.status"
        " FROM flow_runs r JOIN jobsup.dependencies d ON d.child_id = r.job_id JOIN jobsup.jobs p ON p.id = d.parent_id"
        " WHERE r.event = 'start' ORDER BY r.at"
    ).fetchall()
    return [r for r in rows if r[4] is None or r[3] <= r[4]], len(rows)


def unsettled(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM jobsup.dependencies WHERE NOT settled").fetchone()[0]


def completions(conn: psycopg.Connection, kind: str) -> int:
    """How many times jobs of `kind` were written done (the kind's totals): a job completed twice counts
    twice, where its row would still say done once."""
    return conn.execute("SELECT coalesce(sum(done), 0) FROM jobsup.kind_totals WHERE kind = %s", (kind,)).fetchone()[0]


def reaped(conn: psycopg.Connection, workflow_id: int) -> int:
    """Attempts of the workflow's jobs returned by the reaper after their supervisor died."""
    return conn.execute(
        "SELECT count(*) FROM jobsup.jobs j, jsonb_array_elements(j.errors) e"
        " WHERE j.workflow_id = %s AND e->>'error' LIKE 'lease expired%%'",
        (workflow_id,),
    ).fetchone()[0]


def sigkill(sup: Supervisor) -> None:
    """SIGKILL the supervisor alone, as the OOM killer would: its workers must die of it."""
    workers = sup.workers()
    os.kill(sup.pid, signal.SIGKILL)
    sup.process.wait(10)
    wait_for(lambda: not any(alive(w) for w in workers), timeout=10, message="the killed one's workers dead")


def say(line: str) -> None:
    print(f"\n  {line}", end="")


# --- 1. a fan-out of 1,000 and its fan-in, supervisors SIGKILLed -----------------------------------


MEMBERS = 1000


def all_done(conn: psycopg.Connection, ids: Sequence[int]) -> bool:
    [(done,)] = conn.execute("SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'done'", (list(ids),))
    return done == len(ids)


def supervisor_running(sups: Sequence[Supervisor], worker_pid: int) -> Supervisor | None:
    return next((s for s in sups if s.process.poll() is None and worker_pid in {w.pid for w in s.workers()}), None)


@pytest.mark.timeout(240)
def test_a_fan_out_of_1000_and_its_fan_in_survive_supervisors_sigkilled(runs, dsn, start):
    """Root `step` -> 1,000 `step` members (30 ms each) -> one `gather` that reads its parents, on 3
    supervisors x 2 procs. While the members run, a random supervisor is SIGKILLed every 1-2 s and
    another started; once they are done, the supervisor running the fan-in is SIGKILLed mid-run. The
    reaper returns the killed ones' jobs after their 2 s lease. Every handler start of a job comes after
    the done_at of each of its parents; the fan-in completed once (a start without an end first) and read
    all 1,000 done; all 1,002 end done, nothing waiting, every dependency settled."""
    conn = runs
    sups = [launch(start, dsn, *LEASE) for _ in range(3)]
    for sup in sups:
        ready(sup)
    wf = app.workflow("fan under fire")
    root = wf.add("step", {"n": 0}, max_attempts=10)
    members = [wf.add("step", {"n": n, "sleep": 0.03}, after=root, max_attempts=10) for n in range(MEMBERS)]
    # It sleeps so that it can be caught mid-run, the kill below then cuts an attempt of it.
    fan_in = wf.add("gather", {"sleep": 1.5}, after=members, max_attempts=10)
    workflow_id = wf.enqueue(conn)
    began = time.monotonic()
    member_ids = [m.id for m in members]

    kills = 0
    next_kill = time.monotonic() + random.uniform(1.0, 2.0)
    chaos_ends = time.monotonic() + 60
    while not all_done(conn, member_ids) and time.monotonic() < chaos_ends:
        if time.monotonic() >= next_kill:
            sigkill(random.choice([s for s in sups if s.process.poll() is None]))
            kills += 1
            sups.append(launch(start, dsn, *LEASE))
            next_kill = time.monotonic() + random.uniform(1.0, 2.0)
        time.sleep(0.05)
    members_took = time.monotonic() - began

    # The fan-in's first run, cut by its supervisor's death: the retry must still come after every member.
    first_pid = wait_for(
        lambda: conn.execute(
            "SELECT pid FROM flow_runs WHERE job_id = %s AND event = 'start' ORDER BY at LIMIT 1", (fan_in.id,)
        ).fetchone(),
        timeout=60,
        message="the fan-in's first start",
    )[0]
    holder = supervisor_running(sups, first_pid)
    if holder is not None:  # None: the chaos's last kill, as the members ended, cut that run already
        sigkill(holder)
        kills += 1
        sups.append(launch(start, dsn, *LEASE))
    took = wait_ended(conn, workflow_id, timeout=120, sups=sups)

    early, pairs = early_starts(conn)
    [(status, attempts, value, errors)] = conn.execute(
        "SELECT status, attempts, return_value, errors FROM jobsup.jobs WHERE id = %s", (fan_in.id,)
    )
    fan_in_runs = conn.execute(
        "SELECT attempt, event, at FROM flow_runs WHERE job_id = %s ORDER BY at", (fan_in.id,)
    ).fetchall()
    # The end of each member's completing run. A reaped run of a live supervisor stalled past its lease
    # (a loaded machine) may end later, and may: only the completing one is a parent's end.
    last_member_done, last_member_end = conn.execute(
        "SELECT max(j.done_at), max(r.at) FROM jobsup.jobs j"
        " JOIN flow_runs r ON r.job_id = j.id AND r.attempt = j.attempts AND r.event = 'end' WHERE j.id = ANY(%s)",
        (member_ids,),
    ).fetchone()
    tries = dict(
        conn.execute("SELECT attempts, count(*) FROM jobsup.jobs WHERE workflow_id = %s GROUP BY 1", (workflow_id,))
    )
    lost = reaped(conn, workflow_id)
    say(
        f"fan-out {MEMBERS} under SIGKILLs: {kills} kills; members done {members_took:.1f}s after the enqueue, "
        f"the workflow {took:.1f}s after that; {lost} attempts reaped; attempts per job "
        f"{dict(sorted(tries.items()))}; {pairs} (start, parent) pairs checked; the fan-in's runs: "
        f"{[(a, e) for a, e, _ in fan_in_runs]}"
    )
    assert counts(conn, workflow_id) == {"done": MEMBERS + 2}
    assert counts(conn) == {"done": MEMBERS + 2}  # no job outside the workflow either
    assert unsettled(conn) == 0
    assert not early, f"{len(early)} starts before a parent's end, first: {early[0]}"
    assert pairs >= 2 * MEMBERS  # each member's start against the root, the fan-in's against each member
    assert kills >= 3
    fan_in_reaped = sum(1 for e in errors if str(e.get("error", "")).startswith("lease expired"))
    assert fan_in_reaped >= 1, errors  # the kill cut a run of it
    assert lost - fan_in_reaped >= 1  # and the chaos cut runs of members (or the root)
    # The fan-in: completed once, reading every member done; each of its starts after every member's end.
    assert status == "done" and value == {"parents": MEMBERS, "done": MEMBERS, "sum": sum(range(MEMBERS))}
    assert completions(conn, "gather") == 1 and completions(conn, "step") == MEMBERS + 1
    starts = [at for _, event, at in fan_in_runs if event == "start"]
    assert len(starts) >= 2 and attempts >= 2, fan_in_runs
    assert last_member_end is not None and last_member_end < last_member_done
    assert min(starts) > last_member_done and min(starts) > last_member_end
    assert (attempts, "end") in {(a, e) for a, e, _ in fan_in_runs}  # the attempt that completed ran to its end


# --- 2. a chain's order and its latency -------------------------------------------------------------


CHAIN = 100


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_a_chain_runs_in_order_and_each_link_starts_soon_after_its_parent_ends(runs, dsn, start):
    """A chain of 100 `step` jobs under one supervisor: each link's handler starts after the one before
    it is done (its done_at), in the chain's order; the time from a link's done_at to the next one's
    handler start is printed (the release is the parent's outcome write; its NOTIFY wakes the claim).
    Asserted loosely, for a loaded machine: p99 under 1 s."""
    conn = runs
    sup = launch(start, dsn)
    ready(sup)
    wf = app.workflow("chain")
    links = wf.chain(*[{"kind": "step", "payload": {"n": n}} for n in range(CHAIN)])
    workflow_id = wf.enqueue(conn)
    took = wait_ended(conn, workflow_id, timeout=90, sups=[sup])
    assert counts(conn, workflow_id) == {"done": CHAIN}
    ids = [link.id for link in links]
    first_start = dict(
        conn.execute(
            "SELECT job_id, extract(epoch FROM min(at))::float8 FROM flow_runs WHERE event = 'start' GROUP BY 1"
        ).fetchall()
    )
    done_at = dict(conn.execute("SELECT id, extract(epoch FROM done_at)::float8 FROM jobsup.jobs").fetchall())
    assert sorted(first_start) == sorted(ids)
    starts = [first_start[i] for i in ids]
    assert all(a < b for a, b in zip(starts, starts[1:], strict=False)), "links started out of the chain's order"
    gaps = [first_start[child] - done_at[parent] for parent, child in zip(ids, ids[1:], strict=False)]
    assert min(gaps) > 0, f"a link started {-min(gaps) * 1000:.1f} ms before its parent was done"
    early, pairs = early_starts(conn)
    assert not early and pairs == CHAIN - 1
    p50, p99 = percentile(gaps, 0.5), percentile(gaps, 0.99)
    say(
        f"chain of {CHAIN}: parent done_at -> child start p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {max(gaps) * 1000:.1f} ms; {took:.1f}s for the chain"
    )
    assert p99 < 1.0


# --- 3. through PgBouncer ---------------------------------------------------------------------------


def status_of(conn: psycopg.Connection, job_id: int) -> str:
    return conn.execute("SELECT status FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()[0]


@pytest.mark.timeout(180)
def test_a_workflow_enqueued_and_run_through_pgbouncer(runs, dsn, pooled_dsn, start):
    """PgBouncer in transaction mode between the database and everything else: the test's enqueues, the
    supervisor (--pooler transaction) and its handlers (the fan-out of `scan`, the report's parents).
    The workflow waits (after=) for a job done already and for one running: its transaction stays open
    until that one is done, so the dependency is settled by the deferred trigger at commit, on whichever
    server connection PgBouncer lent the transaction. It runs to its end: the report reads 20 parses."""
    conn = runs
    sup = launch(start, dsn, "--dsn", pooled_dsn, "--pooler", "transaction", handlers_dsn=pooled_dsn, env=POOLED)
    ready(sup)
    with psycopg.connect(pooled_dsn, prepare_threshold=None) as pooled:
        earlier = client.enqueue(pooled, "step", {"n": 1})
        pooled.commit()
        wait_for(lambda: status_of(conn, earlier) == "done", timeout=30, message="the earlier job done")
        running = client.enqueue(pooled, "step", {"n": 2, "sleep": 3})
        pooled.commit()
        wait_for(lambda: status_of(conn, running) == "running", timeout=30, message="the other job running")
        wf = app.workflow("pooled")
        first = wf.add("step", {"n": 3}, after=[earlier, running])
        scan = wf.add("scan", {"files": 20}, after=first)
        report = wf.add("report", after=scan)
        workflow_id = wf.enqueue(pooled)
        assert status_of(conn, running) == "running"  # it ends while the transaction is open
        wait_for(lambda: status_of(conn, running) == "done", timeout=30, message="the running parent done")
        assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE id = %s", (first.id,)).fetchone() == (0,)
        pooled.commit()
    assert status_of(conn, first.id) in ("queued", "running", "done")  # both its parents had finished
    wait_ended(conn, workflow_id, timeout=60, sups=[sup])
    assert counts(conn, workflow_id) == {"done": 23}  # first, scan, report and 20 parses
    assert counts(conn) == {"done": 25}
    [value] = conn.execute("SELECT return_value FROM jobsup.jobs WHERE id = %s", (report.id,)).fetchone()
    assert value == {"parents": 21, "parsed": 20, "sum": sum(n * 2 for n in range(20))}
    assert unsettled(conn) == 0
    early, pairs = early_starts(conn)
    assert not early and pairs == 2  # `first` against its two parents: the other kinds record no runs
    first_start, running_done = conn.execute(
        "SELECT (SELECT min(at) FROM flow_runs WHERE job_id = %s AND event = 'start'),"
        " (SELECT done_at FROM jobsup.jobs WHERE id = %s)",
        (first.id, running),
    ).fetchone()
    assert first_start > running_done
    clients = {
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT client_addr::text FROM pg_stat_activity WHERE application_name LIKE 'jobsup %%'"
        )
    }
    assert clients <= {None, "127.0.0.1/32"}  # the supervisor's sessions came through PgBouncer
    assert " ERROR " not in sup.log() and "db.lost" not in sup.log()


# --- 4. drain and a supervisor end alike -------------------------------------------------------------


def parity_workflow() -> Workflow:
    """Failures under each policy, a retry that ends done, a dynamic fan-out and fan-ins."""
    wf = app.workflow("parity")
    root = wf.add("step", {"n": 0})
    dies = wf.add("step", {"n": 1, "fail": True}, after=root)  # retried once (max_attempts 2), then dead
    cancelled = wf.chain({"kind": "step", "payload": {"n": 2}}, {"kind": "step", "payload": {"n": 3}}, after=dies)
    dies_at_once = wf.add("step", {"n": 4, "fail": True}, after=root, max_attempts=1)
    runs_anyway = wf.add("gather", {"n": 5}, after=dies_at_once, on_parent_failure="run")
    retried = wf.add("flaky", {"n": 6, "fails": 2}, after=root)  # done at its third attempt
    scan = wf.add("scan", {"files": 30}, after=retried)
    report = wf.add("report", after=scan)
    wf.add("gather", {"n": 7}, after=[cancelled[-1], runs_anyway, report], on_parent_failure="run")
    return wf


def final(conn: psycopg.Connection) -> list[tuple]:
    """Each job as it ended. Ids are comparable: each run starts from empty tables, identities restarted,
    and only `scan` adds jobs at run time (in one statement), so a job gets the same id in both runs."""
    return conn.execute(
        "SELECT id, kind, payload, status, attempts, parents_left, jsonb_array_length(errors), last_error,"
        " cancelled_by, return_value FROM jobsup.jobs ORDER BY id"
    ).fetchall()


def test_drain_and_a_supervisor_end_a_workflow_alike(runs, dsn, start):
    """One workflow, with a member dead under each policy (one after a retry), a retry that ends done, a
    dynamic fan-out of 30 by `scan` and fan-ins, run once by jobsup.testing.drain and once (from empty
    tables) by a real supervisor: each job ends with the same status, attempts, errors and return value."""
    conn = runs
    parity_workflow().enqueue(conn)
    drain(app, conn, with_scheduled=True)
    drained = final(conn)

    conn.execute(
        "TRUNCATE jobsup.jobs, jobsup.workflows, jobsup.dependencies, jobsup.kind_totals, flow_runs RESTART IDENTITY"
    )
    workflow_id = parity_workflow().enqueue(conn)
    sup = launch(start, dsn)  # --backoff-base 20ms, no jitter: the retries come soon
    wait_ended(conn, workflow_id, timeout=90, sups=[sup])
    supervised = final(conn)

    summary = dict(Counter(row[3] for row in drained))
    say(f"drain and supervisor: {len(drained)} jobs, {summary}")
    assert summary == {"done": 36, "dead": 2, "cancelled": 2}
    assert supervised == drained
    by_job = {(row[1], json.dumps(row[2], sort_keys=True)): row for row in drained}
    assert by_job[("flaky", '{"fails": 2, "n": 6}')][3:5] == ("done", 3)
    assert by_job[("gather", '{"n": 5}')][-1] == {"parents": 1, "done": 0, "sum": 0}
    assert by_job[("gather", '{"n": 7}')][-1] == {"parents": 3, "done": 2, "sum": 0}
    assert early_starts(conn)[0] == []
