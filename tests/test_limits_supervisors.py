"""Limits held across several real `jobsup start` supervisors on one database: concurrency (also under
SIGKILLs and through PgBouncer), per-key concurrency, keys taking turns, rates, and an operator's change
at run time. Every figure is counted from the records the handlers of tests/apps/limited.py write to
`limit_runs` (and from jobsup.jobs), never from logs; run with -s to see them.

These are the short forms, sized for a 2-core machine; the big runs are a benchmark of their own.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psycopg
import pytest

from jobsup import client

from .apps import limited
from .helpers import ROOT, cli_env, wait_for
from .supervisor_helpers import Supervisor, alive, status_counts

APP = "tests.apps.limited:app"
JOBSUP = str(ROOT / ".venv" / "bin" / "jobsup")

# --- helpers: the overlap sweep and the window counts ------------------------------------------------


def max_overlap(intervals: Iterable[tuple[float, float]]) -> tuple[int, float | None]:
    """The most intervals [start, end) that hold at one instant, and the first instant they do: a sweep
    over the starts and ends in time order. One that ends when another starts does not overlap it."""
    events: list[tuple[float, int]] = []
    for start, end in intervals:
        assert end >= start, (start, end)
        events += [(start, 1), (end, -1)]
    events.sort()  # at one instant, ends (-1) before starts (+1)
    best, at, now = 0, None, 0
    for t, step in events:
        now += step
        if now > best:
            best, at = now, t
    return best, at


def last_above(intervals: Iterable[tuple[float, float]], limit: int) -> float | None:
    """The last instant at which more than `limit` intervals held (when that last stopped), or None."""
    events = sorted(e for start, end in intervals for e in ((start, 1), (end, -1)))
    last, now = None, 0
    for t, step in events:
        if now > limit and now + step <= limit:
            last = t
        now += step
    return last


def clip(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The parts of `intervals` inside [lo, hi)."""
    return [(max(s, lo), min(e, hi)) for s, e in intervals if s < hi and e > lo]


def max_in_window(times: Iterable[float], width: float = 1.0) -> tuple[int, float | None]:
    """The most `times` in one window [t, t + width), and its t: the busiest window starts at an event."""
    ts = sorted(times)
    best, at, j = 0, None, 0
    for i, t in enumerate(ts):
        j = max(j, i)
        while j < len(ts) and ts[j] < t + width:
            j += 1
        if j - i > best:
            best, at = j - i, t
    return best, at


def test_max_overlap_on_hand_made_intervals():
    assert max_overlap([]) == (0, None)
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == (1, 0)  # touching: never two at once
    assert max_overlap([(0, 1), (0.5, 2), (0.9, 1.5), (1, 3)]) == (3, 0.9)
    assert max_overlap([(0, 10), (1, 2), (3, 4), (3.5, 5), (3.9, 4.1)]) == (4, 3.9)
    four = [(0, 1), (0.1, 1), (0.2, 1), (0.999, 1.001)]
    assert max_overlap(four)[0] == 4 and max_overlap(four[:3] + [(1, 2)])[0] == 3
    assert clip([(0, 1), (2, 5), (6, 7)], 0.5, 3) == [(0.5, 1), (2, 3)]
    assert last_above([(0, 1), (0.5, 2), (1.5, 3), (2.5, 4)], 1) == 3
    assert last_above([(0, 1), (0.5, 2), (2, 3)], 1) == 1
    assert last_above([(0, 1), (1, 2)], 1) is None
    with pytest.raises(AssertionError):
        max_overlap([(2, 1)])


def test_max_in_window_on_hand_made_times():
    assert max_in_window([]) == (0, None)
    assert max_in_window([0, 0.5, 0.99, 1.0, 1.2]) == (4, 0.5)  # [0, 1) holds 3; [0.5, 1.5) holds 4
    assert max_in_window([0, 1, 2, 3]) == (1, 0)  # a window is half-open
    steady = [i / 64 for i in range(640)]  # 64/s, exactly (binary fractions: no rounding)
    assert max_in_window(steady)[0] == 64
    assert max_in_window(steady + [5.001])[0] == 65
    assert max_in_window([0, 0.1, 0.2], width=0.15)[0] == 2


# --- helpers: supervisors and records ----------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    job_id: int
    attempt: int
    kind: str
    key: str | None
    pid: int
    started: float  # epoch seconds, the database's clock
    ended: float | None


def runs_of(conn: psycopg.Connection, kind: str | None = None) -> list[Run]:
    rows = conn.execute(
        "SELECT job_id, attempt, kind, key, pid, extract(epoch FROM started)::float8,"
        " extract(epoch FROM ended)::float8 FROM limit_runs WHERE %(kind)s::text IS NULL OR kind = %(kind)s"
        " ORDER BY started",
        {"kind": kind},
    ).fetchall()
    return [Run(*row) for row in rows]


def spans(runs: Iterable[Run]) -> list[tuple[float, float]]:
    out = []
    for run in runs:
        assert run.ended is not None, f"run of job {run.job_id} (attempt {run.attempt}) never ended"
        out.append((run.started, run.ended))
    return out


def db_now(conn: psycopg.Connection) -> float:
    return conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]


def supervisors(
    start, dsn: str, count: int, *flags: str, procs: int = 4, records: str | None = None, env=None, app: str = APP
) -> list[Supervisor]:
    """`count` supervisors of --procs `procs` on the limited app, started together and ready."""
    sups = [launch(start, dsn, *flags, procs=procs, records=records, env=env, app=app) for _ in range(count)]
    for sup in sups:
        ready(sup)
    return sups


def launch(
    start, dsn: str, *flags: str, procs: int = 4, records: str | None = None, env=None, app: str = APP
) -> Supervisor:
    return start(*flags, procs=procs, app=app, env={"JOBSUP_LIMITS_DSN": records or dsn, **(env or {})})


def ready(sup: Supervisor, timeout: float = 90) -> None:
    # Several supervisors and their workers importing at once on two cores: slower than the default 20 s.
    sup.wait_log("supervisor.started", timeout=timeout)
    sup.wait_log("app.loaded", timeout=timeout)


def wait_declared(conn: psycopg.Connection, kind: str) -> None:
    wait_for(
        lambda: conn.execute("SELECT limited FROM jobsup.limits WHERE kind = %s", (kind,)).fetchone(),
        timeout=60,
        message=f"the limits of {kind!r} declared",
    )


def wait_all_done(conn: psycopg.Connection, count: int, timeout: float, sups: Sequence[Supervisor] = ()) -> float:
    began = time.monotonic()
    try:
        wait_for(lambda: status_counts(conn) == {"done": count}, timeout=timeout, interval=0.2, message="all done")
    except AssertionError as exc:
        logs = "\n".join(s.log()[-3000:] for s in sups)
        raise AssertionError(f"{exc}: {status_counts(conn)}\n{logs}") from None
    return time.monotonic() - began


def enqueue(conn: psycopg.Connection, kind: str, count: int, seconds: float = 0.05, **opts) -> list[int]:
    ids = client.enqueue_many(conn, [dict(kind=kind, payload={"seconds": seconds}, **opts)] * count)
    assert len(ids) == count
    return [i for i in ids if i is not None]


def attempts(conn: psycopg.Connection, kind: str) -> dict[int, int]:
    return dict(conn.execute("SELECT attempts, count(*) FROM jobsup.jobs WHERE kind = %s GROUP BY 1", (kind,)))


def say(line: str) -> None:
    print(f"\n  {line}", end="")


@pytest.fixture
def records(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute(limited.SCHEMA)
    return conn


# --- 1. concurrency, exact ------------------------------------------------------------------------


@pytest.mark.slow
def test_concurrency_is_exact_across_four_supervisors(dsn, records, start):
    """4 supervisors x 4 procs, 2,000 jobs of 50 ms of kind `three` (concurrency 3): never more than 3
    runs at once, at close to 3 / 50 ms = 60 jobs/s. The target is 0.9 x that = 54/s (55.1 to 55.6
    measured on a quiet machine); asserted is 0.4 x 60 = 24/s, for a shared 2-core machine: with other
    suites and benchmarks running beside it (load 7-9), 32-43/s was measured."""
    conn = records
    n = 2000
    sups = supervisors(start, dsn, 4)
    wait_declared(conn, "three")
    enqueue(conn, "three", n)
    took = wait_all_done(conn, n, timeout=300, sups=sups)
    runs = runs_of(conn, "three")
    assert len(runs) == n and len({r.job_id for r in runs}) == n
    peak, at = max_overlap(spans(runs))
    seconds = max(r.ended for r in runs) - min(r.started for r in runs)
    throughput = n / seconds
    shares = sorted(
        (c for (c,) in conn.execute("SELECT count(*) FROM jobsup.jobs WHERE kind = 'three' GROUP BY locked_by")),
        reverse=True,
    )
    say(
        f"concurrency 3, 4x4 workers, {n} x 50 ms: max overlap {peak}; {throughput:.1f} jobs/s over "
        f"{seconds:.1f}s (target 54/s; all done {took:.1f}s after the enqueue); jobs per supervisor {shares}"
    )
    assert peak <= 3, f"{peak} runs of `three` at once at {at}"
    assert peak == 3  # the limit is reached: the test can see an overlap
    assert attempts(conn, "three") == {1: n}
    assert throughput >= 0.4 * 60, f"{throughput:.1f} jobs/s"


@pytest.mark.slow
def test_concurrency_is_exact_for_short_jobs_handed_out_and_written_at_once(dsn, records, start):
    """The same with 1,500 jobs of 1 ms (with their records, about 2 ms each): short jobs, which a
    supervisor hands out several to a worker and whose outcomes it writes at once while their limit
    holds them back. What a worker holds beyond the one it runs holds slots too: never more than 3
    runs at once."""
    conn = records
    n = 1500
    sups = supervisors(start, dsn, 4)
    wait_declared(conn, "three")
    enqueue(conn, "three", n, seconds=0.001)
    wait_all_done(conn, n, timeout=120, sups=sups)
    runs = runs_of(conn, "three")
    assert len(runs) == n and len({r.job_id for r in runs}) == n
    peak, at = max_overlap(spans(runs))
    seconds = max(r.ended for r in runs) - min(r.started for r in runs)
    say(f"concurrency 3, 4x4 workers, {n} x 1 ms: max overlap {peak}; {n / seconds:.0f} jobs/s")
    assert peak <= 3, f"{peak} runs of `three` at once at {at}"
    assert peak == 3
    assert attempts(conn, "three") == {1: n}


# --- 2. concurrency under SIGKILLs -----------------------------------------------------------------


LEASE = ["--lease", "2s"]  # the floor is 300ms; 2 s is ~40 runs of 50 ms, so no live run outlives it


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_concurrency_holds_while_supervisors_are_sigkilled(dsn, records, start):
    """4 supervisors x 4 procs, kind `three` (concurrency 3), 600 jobs of 50 ms; for 12 s a random
    supervisor is SIGKILLed (alone: its workers must die of it) every 1-2 s and another started. Its
    held jobs keep their slots until the reaper returns them (--lease 2s), so the runs never overlap
    more than 3 at any instant; every job ends done; no job runs twice at once."""
    sigkill_chaos(records, start, dsn, "three", 3, 600)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_concurrency_holds_for_shared_jobs_while_supervisors_are_sigkilled(dsn, records, start):
    """The same for a kind whose jobs share worker processes (tests/apps/limited_shared.py): 4
    supervisors x 2 processes of --capacity 200, kind `ten_shared` (concurrency 10), 2,000 jobs of 50 ms:
    room for 1,600 at once, and never more than 10 running."""
    sigkill_chaos(
        records, start, dsn, "ten_shared", 10, 2000, "--capacity", "200", procs=2, app="tests.apps.limited_shared:app"
    )


def sigkill_chaos(
    conn: psycopg.Connection,
    start,
    dsn: str,
    kind: str,
    limit: int,
    n: int,
    *flags: str,
    procs: int = 4,
    app: str = APP,
) -> None:
    sups = supervisors(start, dsn, 4, *LEASE, *flags, procs=procs, app=app)
    wait_declared(conn, kind)
    enqueue(conn, kind, n)
    wait_for(lambda: runs_of(conn, kind), timeout=30, message="runs")
    killed: dict[int, tuple[float, float]] = {}  # a killed supervisor's worker -> (killed at, dead by)
    kills = 0
    chaos_ends = time.monotonic() + 12
    while time.monotonic() < chaos_ends:
        time.sleep(random.uniform(1.0, 2.0))
        victim = random.choice([s for s in sups if s.process.poll() is None])
        workers = victim.workers()
        killed_at = db_now(conn)
        os.kill(victim.pid, signal.SIGKILL)  # the supervisor alone, as the OOM killer would
        victim.process.wait(10)
        wait_for(lambda ws=workers: not any(alive(w) for w in ws), timeout=10, message="the killed one's workers dead")
        dead_by = db_now(conn)
        killed.update((w.pid, (killed_at, dead_by)) for w in workers)
        kills += 1
        sups.append(launch(start, dsn, *LEASE, *flags, procs=procs, app=app))
    took = wait_all_done(conn, n, timeout=120, sups=sups)
    jobs = dict(conn.execute("SELECT id, errors FROM jobsup.jobs WHERE kind = %s", (kind,)).fetchall())
    reaped_at: dict[tuple[int, int], float] = {}
    for job_id, errors in jobs.items():
        for entry in errors or []:
            if str(entry.get("error", "")).startswith("lease expired"):
                at = conn.execute("SELECT extract(epoch FROM %s::timestamptz)::float8", (entry["at"],)).fetchone()[0]
                reaped_at[(job_id, entry["attempt"])] = at
    runs = runs_of(conn, kind)
    cut = [r for r in runs if r.ended is None]
    unexplained = [r for r in cut if r.pid not in killed]
    assert not unexplained, f"runs that never ended, not of a killed supervisor: {unexplained}"
    # A run cut by a kill ends when its worker died at the latest. The hold of a reaped attempt (its
    # slot) ends when the reaper returned it, whether its run ended or not: both must stay within 3.
    as_runs = [(r, r.started, r.ended if r.ended is not None else killed[r.pid][1]) for r in runs]
    as_holds = [(r.started, reaped_at.get((r.job_id, r.attempt), r.ended or math.inf)) for r in runs]
    peak_runs, at_runs = max_overlap((s, e) for _, s, e in as_runs)
    peak_holds, at_holds = max_overlap(as_holds)
    # No job run by two live runs at once: each of its runs ended (or its worker died) before the next.
    by_job: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for run, s, e in as_runs:
        by_job[run.job_id].append((s, e))
    twice = {j: s for j, s in by_job.items() if max_overlap(s)[0] > 1}
    # How the killed supervisors' workers went: dead within how long of the kill (polled, an upper bound);
    # runs of theirs that still ended after the kill (a worker outliving its supervisor a little).
    died_within = max((dead - at for at, dead in killed.values()), default=0)
    outlived = [r.ended - killed[r.pid][0] for r in runs if r.pid in killed and (r.ended or 0) > killed[r.pid][0]]
    reaped_runs = {(r.job_id, r.attempt): r for r in runs if (r.job_id, r.attempt) in reaped_at}
    tries = attempts(conn, kind)
    say(
        f"SIGKILL chaos: {kills} kills in 12 s; {len(killed)} workers died with them, each within "
        f"{died_within * 1000:.0f} ms; {len(outlived)} runs ended after their supervisor's kill (at most "
        f"{max(outlived, default=0) * 1000:.0f} ms after), {len(cut)} runs cut; {len(reaped_at)} attempts reaped "
        f"({len(reaped_runs)} of them had a run); max overlap {peak_runs} (runs), {peak_holds} (holds); {n} done "
        f"{took:.1f}s after the chaos; attempts {dict(sorted(tries.items()))}"
    )
    assert kills >= 5
    assert peak_runs <= limit, f"{peak_runs} runs at once at {at_runs}"
    assert peak_holds <= limit, f"{peak_holds} holds at once at {at_holds}"
    assert not twice, f"jobs run twice at once: {twice}"
    assert {r.job_id for r in runs} == set(jobs) and len(jobs) == n  # nothing lost, each ran


# --- 3. per key ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_key_concurrency_one_across_four_supervisors(dsn, records, start):
    """4 supervisors x 4 procs; kind `per_key` (key_concurrency 1) with 20 keys given at enqueue, 10 jobs
    each, and kind `account` (key_concurrency 1, its key from the payload) with 8 accounts, 10 each: no
    two runs of one key overlap, while runs of different keys do."""
    conn = records
    sups = supervisors(start, dsn, 4)
    wait_declared(conn, "per_key")
    wait_declared(conn, "account")
    jobs = [{"kind": "per_key", "key": f"k{i}", "payload": {"seconds": 0.05}} for _ in range(10) for i in range(20)]
    jobs += [{"kind": "account", "payload": {"seconds": 0.05, "account": f"a{i}"}} for _ in range(10) for i in range(8)]
    limited.app.enqueue_many(conn, jobs)
    wait_all_done(conn, len(jobs), timeout=90, sups=sups)
    peaks = {}
    for kind in ("per_key", "account"):
        runs = runs_of(conn, kind)
        assert len(runs) == (200 if kind == "per_key" else 80)
        by_key: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            by_key[run.key].append(run)
        assert len(by_key) == (20 if kind == "per_key" else 8) and None not in by_key
        worst = max((max_overlap(spans(rs))[0], key) for key, rs in by_key.items())
        overall = max_overlap(spans(runs))[0]
        peaks[kind] = (worst, overall)
        assert worst[0] <= 1, f"{kind}: key {worst[1]} ran {worst[0]} at once"
        assert overall > 1  # different keys ran at once: the check above could have failed
    say(f"key_concurrency 1: max overlap per key, overall: {peaks}")


# --- 4. keys take turns -------------------------------------------------------------------------------


@pytest.mark.slow
def test_keys_take_turns_a_big_backlog_does_not_starve_small_keys(dsn, records, start):
    """One key with 2,000 jobs of 10 ms (enqueued first, so oldest) and 19 keys with 20 each, all before
    the supervisors start; kind `fair` (concurrency 8, every worker: no limit that matters), 2 supervisors
    x 4 procs: every small key has finished before the big key is half done. The test stops once the
    small keys are done (the rest of the big key's backlog is not waited for)."""
    conn = records
    client.enqueue_many(conn, [{"kind": "fair", "key": "big", "payload": {"seconds": 0.01}}] * 2000)
    client.enqueue_many(
        conn, [{"kind": "fair", "key": f"small{i:02}", "payload": {"seconds": 0.01}} for i in range(19)] * 20
    )
    began = db_now(conn)
    sups = supervisors(start, dsn, 2)

    def small_done() -> bool:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done' AND key <> 'big'),"
            " count(*) FILTER (WHERE status = 'done' AND key = 'big') FROM jobsup.jobs"
        ).fetchone()
        return row[0] == 380 or row[1] >= 1000

    wait_for(small_done, timeout=120, interval=0.1, message="the small keys done")
    for sup in sups:
        sup.kill()
    runs = [r for r in runs_of(conn, "fair") if r.ended is not None]
    small = [r for r in runs if r.key != "big"]
    big_ends = sorted(r.ended for r in runs if r.key == "big")
    assert len(small) == 380, f"{len(small)} small jobs ran before the big key was half done"
    small_last = max(r.ended for r in small)
    big_by_then = sum(1 for t in big_ends if t <= small_last)
    first = min(r.started for r in runs)
    peak, _ = max_overlap(spans(runs))
    say(
        f"fairness: the 19 small keys (380 jobs) finished {small_last - first:.1f}s after the first start, "
        f"when the big key had finished {big_by_then} of 2000 ({big_by_then / 20:.1f}%); max overlap {peak}"
        f" of 8; supervisors up {first - began:.1f}s after the enqueue"
    )
    assert big_by_then < 1000
    assert peak <= 8


# --- 5. rates ----------------------------------------------------------------------------------------


# Handler starts are claims delayed by the dispatch (a pipe to the worker, a process waking, the
# handler's own INSERT): a window of handler starts holds at most the claims of a window as long as 1 s
# plus the spread of that delay. The tolerance allows 100 ms of it (10 starts at 100/s, 1 at 10/s); the
# figures printed show the delays measured (a median of 6-10 ms on this loaded machine, and a rare
# stall of 100-400 ms, which would matter only if it came with the rate at its full).
JITTER_SECONDS = 0.1


def rate_figures(pairs: Sequence[tuple[float, float]], rate: float, burst: int, what: str) -> dict[str, object]:
    """Check (claim, handler start) times of one rate's jobs against it; its figures, for the report.

    Asserted: at most rate + burst claims in any 1-second window, and no claim ahead of the schedule
    (the k-th no sooner than k - burst + 1 intervals after the first: a claim that comes late keeps the
    schedule, so two may come closer than an interval, never ahead of it); at most that + rate x
    JITTER_SECONDS handler starts in a window; no handler started before its claim; and the rate over
    the run within 2% of `rate`."""
    claims = sorted(c for c, _ in pairs)
    delays = sorted(s - c for c, s in pairs)
    claim_max, at = max_in_window(claims)
    start_max, start_at = max_in_window([s for _, s in pairs])
    ahead = min(c - claims[0] - (k - burst + 1) / rate for k, c in enumerate(claims) if k >= burst)
    measured = (len(claims) - burst) / (claims[-1] - claims[0])  # the first `burst` at once, then the rate
    tolerance = math.ceil(rate * JITTER_SECONDS)
    assert claim_max <= rate + burst, f"{what}: {claim_max} claims in the second from {at}"
    # timestamps are of microseconds: a claim on time may look 1-2 us early
    assert ahead >= -2e-6 * len(claims), f"{what}: a claim {-ahead * 1000:.3f} ms ahead of the schedule"
    assert start_max <= rate + burst + tolerance, f"{what}: {start_max} handler starts in the second from {start_at}"
    assert delays[0] >= 0, f"{what}: a handler started {-delays[0] * 1000:.1f} ms before its claim"
    assert abs(measured - rate) <= 0.02 * rate, f"{what}: {measured:.2f}/s, not within 2% of {rate:g}/s"

    def ms(q: float) -> float:
        return round(delays[min(len(delays) - 1, int(q * len(delays)))] * 1000, 1)

    return {
        "claims max/1s": claim_max,
        "handler starts max/1s": start_max,
        "most ahead of the schedule ms": round(-ahead * 1000, 3),
        "rate": round(measured, 2),
        "dispatch ms p50/p99/max": (ms(0.5), ms(0.99), ms(1)),
    }


def claims_and_starts(conn: psycopg.Connection, kind: str) -> list[tuple[str | None, float, float]]:
    """(key, claimed, handler started) of each job of `kind`, claimed once."""
    return conn.execute(
        "SELECT j.key, extract(epoch FROM j.started_at)::float8, extract(epoch FROM r.started)::float8"
        " FROM jobsup.jobs j JOIN limit_runs r ON r.job_id = j.id AND r.attempt = j.attempts WHERE j.kind = %s",
        (kind,),
    ).fetchall()


def test_rate_figures_on_hand_made_claims():
    steady = [(i / 64, i / 64 + 0.005) for i in range(320)]  # 64/s exactly, 5 ms to each handler
    assert rate_figures(steady, 64, 1, "steady")["rate"] == 64
    with pytest.raises(AssertionError, match="claims in the second"):
        extra = [(2.5 + i / 256, 2.51) for i in (1, 2, 3)]
        rate_figures(steady + extra, 64, 2, "three more")  # burst 2 allows 66 in a second, not 67
    with pytest.raises(AssertionError, match="ahead of the schedule"):
        rate_figures([*steady, (2.5 + 1 / 256, 2.51)], 64, 1, "early")
    with pytest.raises(AssertionError, match="before its claim"):
        rate_figures([*steady[:-1], (steady[-1][0], steady[-1][0] - 0.001)], 64, 1, "backwards")
    with pytest.raises(AssertionError, match="not within 2%"):
        rate_figures(steady[::4], 64, 1, "slow")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rate_is_exact_across_four_supervisors(dsn, records, start):
    """Kind `rated` (100/s, burst 1), 4 supervisors x 4 procs, 3,000 jobs of 20 ms ready at once: 30 s
    at the rate. Claims (jobsup.jobs.started_at) never above the rate in any 1-second window, nor
    closer than 10 ms; handler starts within it plus the dispatch's jitter; every job claimed once
    (attempts 1); the rate over the run within 2% of 100/s."""
    conn = records
    n = 3000
    sups = supervisors(start, dsn, 4)
    wait_declared(conn, "rated")
    enqueue(conn, "rated", n, seconds=0.02)
    took = wait_all_done(conn, n, timeout=180, sups=sups)
    assert attempts(conn, "rated") == {1: n}
    rows = claims_and_starts(conn, "rated")
    assert len(rows) == n
    figures = rate_figures([(c, s) for _, c, s in rows], 100, 1, "rated")
    say(f"rate 100/s, 4x4 workers, {n} jobs, all done {took:.1f}s after the enqueue: {figures}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_key_rate_is_exact_across_four_supervisors(dsn, records, start):
    """Kind `key_rated` (key_rate 10/s, burst 1), 4 supervisors x 4 procs, 4 keys of 60 jobs of 20 ms
    each, ready at once: ~6 s at 10/s per key. Per key, the same checks as the kind's rate above; the
    keys run side by side."""
    conn = records
    keys, each = 4, 60
    sups = supervisors(start, dsn, 4)
    wait_declared(conn, "key_rated")
    client.enqueue_many(
        conn, [{"kind": "key_rated", "key": f"r{k}", "payload": {"seconds": 0.02}} for k in range(keys)] * each
    )
    wait_all_done(conn, keys * each, timeout=120, sups=sups)
    assert attempts(conn, "key_rated") == {1: keys * each}
    by_key: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key, claimed, started in claims_and_starts(conn, "key_rated"):
        by_key[key].append((claimed, started))
    assert sorted(by_key) == [f"r{k}" for k in range(keys)]
    figures = {key: rate_figures(pairs, 10, 1, f"key {key}") for key, pairs in sorted(by_key.items())}
    together, _ = max_in_window([c for pairs in by_key.values() for c, _ in pairs])
    say(f"key_rate 10/s, {keys} keys x {each}: all keys together max {together}/1s; per key:")
    for key, figure in figures.items():
        say(f"  {key}: {figure}")
    assert together > 11  # the keys ran side by side


# --- 6. an operator's change at run time --------------------------------------------------------------


def limit_cli(dsn: str, *args: str) -> float:
    """`jobsup limit ARGS` through the real CLI; when the change was made (its set_at, the db's clock)."""
    result = subprocess.run(
        [JOBSUP, "limit", *args, "--dsn", dsn], capture_output=True, text=True, env=cli_env(), timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT extract(epoch FROM set_at)::float8 FROM jobsup.limits WHERE kind = %s", (args[0],)
        ).fetchone()[0]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_limit_changed_at_run_time_is_obeyed_by_every_supervisor(dsn, records, start):
    """4 supervisors x 4 procs running `three` (concurrency 3) jobs of 50 ms. `jobsup limit three
    --concurrency 1`: from 2 s after it, never more than 1 run at once (watched for 3 s). Then `jobsup
    limit three --remove`: full speed again, more than 3 runs at once with 16 workers."""
    conn = records
    supervisors(start, dsn, 4)
    wait_declared(conn, "three")
    enqueue(conn, "three", 3000)
    wait_for(lambda: len(runs_of(conn, "three")) >= 60, timeout=30, message="runs flowing")
    set_one = limit_cli(dsn, "three", "--concurrency", "1")
    wait_for(lambda: db_now(conn) >= set_one + 5, timeout=30, message="5 s at concurrency 1")
    removed = limit_cli(dsn, "three", "--remove")
    wait_for(lambda: db_now(conn) >= removed + 3, timeout=30, message="3 s without a limit")
    runs = [r for r in runs_of(conn, "three") if r.ended is not None]
    before = max_overlap(clip(spans(runs), 0, set_one))[0]
    settling = max_overlap(clip(spans(runs), set_one, set_one + 2))[0]
    obeying_runs = clip(spans(runs), set_one + 2, removed)
    obeying, at = max_overlap(obeying_runs)
    free_runs = clip(spans(runs), removed, math.inf)
    free, _ = max_overlap(free_runs)
    free_after_1s, _ = max_overlap(clip(spans(runs), removed + 1, math.inf))
    above = last_above(clip(spans(runs), set_one, removed), 1)
    obeyed = 0.0 if above is None else above - set_one
    say(
        f"run-time change: max overlap {before} before (limit 3), {settling} in the 2 s after --concurrency 1 "
        f"(the last overlap above 1 ended {obeyed * 1000:.0f} ms after it), "
        f"{obeying} from 2 s after it ({len(obeying_runs)} runs in {removed - set_one - 2:.1f}s), {free} after "
        f"--remove ({free_after_1s} from 1 s after; {len(free_runs)} runs in 3 s)"
    )
    assert before == 3
    assert obeying <= 1, f"{obeying} runs at once at {at}, {at - set_one:.2f}s after the limit went to 1"
    assert len(obeying_runs) >= 10  # jobs still ran, one at a time
    assert free > 3


# --- 7. through PgBouncer -----------------------------------------------------------------------------

POOLED = {"JOBSUP_POOLER": "transaction"}


@pytest.mark.slow
def test_concurrency_is_exact_through_pgbouncer(dsn, records, start, pooled_dsn):
    """The concurrency test through PgBouncer in transaction mode (--pooler transaction), 4 supervisors x
    4 procs, 300 jobs of 50 ms of `three` (the direct test runs 600): never more than 3 runs at once."""
    conn = records
    pooled = pooled_dsn
    n = 300
    sups = supervisors(start, dsn, 4, "--dsn", pooled, "--pooler", "transaction", records=dsn, env=POOLED)
    wait_declared(conn, "three")
    enqueue(conn, "three", n)
    wait_all_done(conn, n, timeout=120, sups=sups)
    runs = runs_of(conn, "three")
    peak, at = max_overlap(spans(runs))
    seconds = max(r.ended for r in runs) - min(r.started for r in runs)
    say(f"through PgBouncer: {n} jobs, max overlap {peak}, {n / seconds:.1f} jobs/s")
    assert len(runs) == n
    assert peak <= 3, f"{peak} runs at once at {at}"
    assert attempts(conn, "three") == {1: n}
    assert " ERROR " not in "".join(s.log() for s in sups)
