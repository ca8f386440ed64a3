"""What workflows cost: a fan-in's last outcome write, a chain's step, and jobs without dependencies.

    .venv/bin/python -m benchmarks.bench_workflows [--dsn DSN] [--only fanin,chain,trigger] [--runs 15]
        [--members 10000] [--samples 10] [--procs 2] [--chains 1x200,20x50] [--pickups 200] [--json PATH]
    .venv/bin/python -m benchmarks.bench_workflows --only noop [--pairs 10] [--jobs 100000]
        [--base /tmp/base] [--base-commit 0d1f1c0] [--dsn DSN] [--json PATH]

  - fanin: a workflow of --members jobs and one job after all of them (no root), the members claimed
    through lifecycle.claim; all but one completed in batches, then the last one completed alone: the
    time of its outcome write (lifecycle.complete on a connection set up as the supervisor's, commit
    included), which releases the fan-in job. Beside it, in the same run and alternating with it, the
    same write for a job without children ("plain") and for a member that is not the last (one
    decrement). Medians over --runs, and the median of each run's last / plain.
  - chain: one `jobsup start --procs N` on the bench app runs chains of no-op jobs (--chains COUNTxLENGTH,
    all chains of a size in one workflow): from a parent's done_at to its child's started_at, p50 and
    p99, and from the parent's started_at (so with the outcome flush). Beside it, measured the same way
    before the chains, a fresh job's pickup: created_at to started_at of --pickups jobs enqueued one at
    a time, 20 ms apart, into the idle supervisor; and the outcome flush interval of the supervisor's
    defaults. All of these are database timestamps.
  - trigger: what the row triggers on a status update cost a job with no children and no limit (the
    one that settles a finished parent's children, and the claim protocol's): one connection claims and
    completes 30,000 jobs 100 at a time, with both, without the first, and without either (dropped for
    the run), in turns, --runs times; microseconds per job, medians.
  - noop: --jobs no-op jobs drained by `jobsup start --procs 8` of this checkout and of a clone of
    --base-commit (the release before workflows) in --base, made with its own venv when missing,
    alternately, --pairs times: jobs/s and CPU per job, each pair's ratios and their medians
    (benchmarks/bench_beside.py, which says how).

--dsn is an empty database for fanin and chain (default: an embedded server in a temporary directory);
noop makes databases of its own on its server. Every figure is a shared 2-core machine's: run it when the
machine is quiet (noop's supervisors run 8 workers each).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import bench_beside, scratch
from benchmarks.bench_limits import start_supervisor
from benchmarks.bench_supervisor import bench_parser
from jobsup import client
from jobsup.db import lifecycle
from jobsup.db.sql import one_row
from jobsup.errors import BadInput
from jobsup.ops import bench
from jobsup.ops.bench import BenchFailed, percentile
from jobsup.supervisor.config import Config
from jobsup.supervisor.supervisor import SESSION
from jobsup.workflow import Workflow

# Kinds of the fan-in runs, which no supervisor runs: the benchmark claims and completes them itself.
MEMBER, FANIN, PLAIN = "member", "fanin", "plain"
LOCKED_BY = "bench-workflows:writer"  # the claims' and outcome writes' locked_by, as a supervisor's id
LEASE = 3600.0  # seconds: no reaper runs here, but a lapsed lease would not fence a write anyway
BATCH = Config().batch  # the members not timed are completed this many at a time, as a supervisor claims them
NOOP = "noop"  # the bench app's handler that does nothing
BASE_COMMIT = "0d1f1c0"  # the release before workflows


# --- fanin -------------------------------------------------------------------------------------------


def writer(dsn: str) -> psycopg.Connection:
    """A connection set up as the supervisor's outcome writes' (supervisor/link.py)."""
    options = " ".join(f"-c {key}={value}" for key, value in SESSION.items())
    return psycopg.connect(dsn, autocommit=True, options=options, prepare_threshold=5)


def claim_all(conn: psycopg.Connection, kind: str, count: int) -> list[tuple[int, int]]:
    held: list[tuple[int, int]] = []
    while len(held) < count:
        jobs = lifecycle.claim(conn, ["default"], min(1000, count - len(held)), LOCKED_BY, LEASE, kinds=[kind])
        if not jobs:
            raise BenchFailed(f"bench: claimed {len(held)} {kind} jobs of {count}")
        held += [(j.id, j.attempts) for j in jobs]
    return held


def timed_complete(conn: psycopg.Connection, job: tuple[int, int]) -> float:
    """Milliseconds of one job's outcome write."""
    started = time.perf_counter()
    written = lifecycle.complete(conn, [job], LOCKED_BY)
    took = (time.perf_counter() - started) * 1000
    if written != [job[0]]:
        raise BenchFailed(f"bench: job {job[0]} was not completed")
    return took


def fanin_state(conn: psycopg.Connection, job_id: int) -> tuple[str, int]:
    row = conn.execute("SELECT status, parents_left FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return row[0], row[1]


def fanin_run(conn: psycopg.Connection, members: int, samples: int) -> dict[str, float]:
    """One fan-in of `members` built, and its members completed: the last alone, between two plain
    completions; `samples` non-last members alone halfway, alternating with plain completions."""
    wf = Workflow("bench fan-in")
    fanin_job = wf.group([MEMBER] * members, then=FANIN).then
    with conn.transaction():
        wf.enqueue(conn)
    client.enqueue_many(conn, [{"kind": PLAIN}] * (samples + 2))
    for table in ("jobsup.jobs", "jobsup.dependencies"):
        conn.execute(f"ANALYZE {table}")  # autovacuum would soon, at an arbitrary moment of the timings
    assert fanin_job is not None and fanin_job.id is not None
    *others, last = claim_all(conn, MEMBER, members)
    plain = claim_all(conn, PLAIN, samples + 2)
    half = (len(others) - samples) // 2
    for start in range(0, half, BATCH):
        lifecycle.complete(conn, others[start : min(start + BATCH, half)], LOCKED_BY)
    member_ms, plain_ms = [], []
    for job, alone in zip(others[half : half + samples], plain[2:], strict=True):
        plain_ms.append(timed_complete(conn, alone))
        member_ms.append(timed_complete(conn, job))
    rest = others[half + samples :]
    for start in range(0, len(rest), BATCH):
        lifecycle.complete(conn, rest[start : start + BATCH], LOCKED_BY)
    if fanin_state(conn, fanin_job.id) != ("waiting", 1):
        raise BenchFailed(f"bench: before its last member, the fan-in job is {fanin_state(conn, fanin_job.id)}")
    plain_ms.append(timed_complete(conn, plain[0]))
    last_ms = timed_complete(conn, last)
    plain_ms.append(timed_complete(conn, plain[1]))
    if fanin_state(conn, fanin_job.id) != ("queued", 0):
        raise BenchFailed(f"bench: after its last member, the fan-in job is {fanin_state(conn, fanin_job.id)}")
    conn.execute("TRUNCATE jobsup.jobs, jobsup.dependencies, jobsup.workflows")  # each run starts alike
    return {
        "fanin_last_ms": last_ms,
        "fanin_member_ms": statistics.median(member_ms),
        "plain_ms": statistics.median(plain_ms),
        "fanin_last_vs_plain": last_ms / statistics.median(plain_ms),
    }


def fanin(dsn: str, runs: int, members: int, samples: int) -> dict[str, float]:
    with writer(dsn) as conn:
        results = []
        for number in range(1, runs + 1):
            results.append(fanin_run(conn, members, samples))
            r = results[-1]
            print(
                f"fanin run {number}: last {r['fanin_last_ms']:.2f} ms, not last {r['fanin_member_ms']:.2f} ms, "
                f"plain {r['plain_ms']:.2f} ms",
                flush=True,
            )
    medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
    print(
        f"\nfan-in of {members:,}, median of {runs} runs ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}):\n"
        f"  the last member's outcome write (releases the fan-in job)  {medians['fanin_last_ms']:8.2f} ms\n"
        f"  a member's that is not the last (one decrement)             {medians['fanin_member_ms']:8.2f} ms\n"
        f"  a job's without children                                    {medians['plain_ms']:8.2f} ms\n"
        f"  last / plain (median of the runs' ratios)                   {medians['fanin_last_vs_plain']:8.2f}"
        "    target: within 2"
    )
    return medians


# --- chain -------------------------------------------------------------------------------------------


def chain_specs(text: str) -> list[tuple[int, int]]:
    """
    >>> chain_specs("1x200, 20x50")
    [(1, 200), (20, 50)]
    """
    specs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        count, _, length = part.partition("x")
        if not (count.isdigit() and length.isdigit() and int(count) > 0 and int(length) > 1):
            raise BadInput(f"--chains takes COUNTxLENGTH items (a length of 2 or more), as 1x200,20x50, not {part!r}")
        specs.append((int(count), int(length)))
    if not specs:
        raise BadInput("--chains names no chain")
    return specs


def wait_done(conn: psycopg.Connection, ids: list[int], what: str) -> None:
    def done() -> bool:
        row = conn.execute("SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'done'", [ids])
        return one_row(row.fetchone(), "done count")[0] == len(ids)

    # Seldom: the polls share the server with what they measure. The bound is generous (a step takes ms), and
    # shorter than the smoke test's, so a job never released fails the run, which stops its supervisor.
    bench.wait(done, 60 + 0.05 * len(ids), what, interval=0.05)


def chain_steps(conn: psycopg.Connection, count: int, length: int) -> tuple[list[float], list[float], float]:
    """`count` chains of `length` no-op jobs, enqueued in one workflow and run: for each step, sorted,
    the ms from the parent's done_at, and from its started_at, to the child's started_at; and the jobs/s
    from the workflow's enqueue to its last job's done_at."""
    wf = Workflow("bench chains")
    refs = [ref for _ in range(count) for ref in wf.chain(*[NOOP] * length)]
    with conn.transaction():
        workflow_id = wf.enqueue(conn)
    wait_done(conn, [r.id for r in refs if r.id is not None], f"{count} chains of {length}")
    rows = conn.execute(
        "SELECT extract(epoch FROM c.started_at - p.done_at) * 1000, extract(epoch FROM c.started_at - p.started_at)"
        " * 1000 FROM jobsup.dependencies d JOIN jobsup.jobs p ON p.id = d.parent_id"
        " JOIN jobsup.jobs c ON c.id = d.child_id WHERE c.workflow_id = %s",
        [workflow_id],
    ).fetchall()
    assert len(rows) == count * (length - 1)
    took = conn.execute(
        "SELECT extract(epoch FROM max(done_at) - min(created_at)) FROM jobsup.jobs WHERE workflow_id = %s",
        [workflow_id],
    ).fetchone()
    rate = count * length / float(one_row(took, "chains' time")[0])
    return sorted(float(r[0]) for r in rows), sorted(float(r[1]) for r in rows), rate


def pickups(conn: psycopg.Connection, count: int) -> list[float]:
    """Ms from created_at to started_at of `count` jobs enqueued one at a time into an idle supervisor,
    after a warm-up, sorted."""
    sizes = bench.Sizes()
    ids = []
    for number in range(sizes.pickup_warmup + count):
        job_id = client.enqueue(conn, NOOP)
        assert job_id is not None
        if number >= sizes.pickup_warmup:
            ids.append(job_id)
        time.sleep(sizes.pickup_gap)
    wait_done(conn, ids, "the pickups")
    rows = conn.execute(
        "SELECT extract(epoch FROM started_at - created_at) * 1000 FROM jobsup.jobs WHERE id = ANY(%s)", [ids]
    )
    return sorted(float(r[0]) for r in rows)


def chain(dsn: str, procs: int, specs: list[tuple[int, int]], pickup_count: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        process, _ = start_supervisor(dsn, procs)
        try:
            fresh = pickups(conn, pickup_count)  # first, while nothing else has run: the supervisor idles
            steps = {spec: chain_steps(conn, *spec) for spec in specs}
        finally:
            process.terminate()
            process.wait(60)
    flush = Config().flush_interval * 1000
    figures.update(pickup_p50_ms=percentile(fresh, 50), pickup_p99_ms=percentile(fresh, 99), flush_interval_ms=flush)
    print(
        f"\nchains of no-op jobs through `jobsup start --procs {procs}` ({os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}), p50 / p99 of a step to the child's started_at,\n"
        "from the parent's done_at (its outcome write, after the flush's wait) and from its started_at:"
    )
    for (count, length), (from_done, from_start, rate) in steps.items():
        name = f"chain_{count}x{length}"
        figures.update(
            {
                f"{name}_p50_ms": percentile(from_done, 50),
                f"{name}_p99_ms": percentile(from_done, 99),
                f"{name}_from_start_p50_ms": percentile(from_start, 50),
                f"{name}_from_start_p99_ms": percentile(from_start, 99),
                f"{name}_jobs_per_s": rate,
            }
        )
        print(
            f"  {count:>3} x {length:<4} from done_at {figures[f'{name}_p50_ms']:6.2f} / "
            f"{figures[f'{name}_p99_ms']:6.2f} ms, from started_at {figures[f'{name}_from_start_p50_ms']:6.2f} / "
            f"{figures[f'{name}_from_start_p99_ms']:6.2f} ms; {rate:,.0f} jobs/s"
            + ("" if count <= procs else f" ({count} chains on {procs} workers: a step waits for a worker)")
        )
    print(
        f"  a fresh job ({pickup_count} enqueued one at a time), created_at to started_at "
        f"{figures['pickup_p50_ms']:.2f} / {figures['pickup_p99_ms']:.2f} ms\n"
        f"  outcome flush interval (jobsup/supervisor/config.py) {flush:.0f} ms\n"
        f"  target: a step from done_at no worse than a fresh job's pickup plus one flush: "
        f"{figures['pickup_p50_ms'] + flush:.2f} / {figures['pickup_p99_ms'] + flush:.2f} ms"
    )
    return figures


# --- trigger -----------------------------------------------------------------------------------------

TRIGGER_JOBS = 30_000


def claim_complete_us(conn: psycopg.Connection) -> float:
    """TRIGGER_JOBS plain jobs claimed and completed 100 at a time on `conn`: microseconds per job."""
    conn.execute("INSERT INTO jobsup.jobs (kind) SELECT %s FROM generate_series(1, %s)", [PLAIN, TRIGGER_JOBS])
    conn.execute("VACUUM ANALYZE jobsup.jobs")
    started = time.perf_counter()
    while jobs := lifecycle.claim(conn, ["default"], 100, LOCKED_BY, LEASE):
        lifecycle.complete(conn, [(j.id, j.attempts) for j in jobs], LOCKED_BY)
    took = time.perf_counter() - started
    conn.execute("TRUNCATE jobsup.jobs")
    return took * 1e6 / TRIGGER_JOBS


# Each side of the trigger mode: the row triggers on a status update dropped for its runs. PostgreSQL
# reads the old row of every update of a table with any AFTER UPDATE row trigger, before it asks each
# trigger's WHEN: dropping one of the two saves nothing while the other stays.
TRIGGER_SIDES = {
    "with": (),
    "without jobs_finished": ("jobs_finished",),
    "without row triggers": ("jobs_finished", "jobs_claim_protocol"),
}


def trigger(dsn: str, runs: int) -> dict[str, float]:
    """What the row triggers on a status update (jobs_finished, and the claim protocol's) cost the jobs
    they have nothing to do for: one connection set up as the supervisor's claims and completes jobs
    without children or limits, with both triggers, without jobs_finished, and without either (dropped
    for the run, in the same database), in turns."""
    figures: dict[str, list[float]] = {side: [] for side in TRIGGER_SIDES}
    with writer(dsn) as conn:
        # The triggers as the schema has them, to put back after each run without them.
        definitions = {
            name: one_row(
                conn.execute("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = %s", [name]).fetchone(),
                f"the definition of {name}",
            )[0]
            for name in TRIGGER_SIDES["without row triggers"]
        }
        conn.execute("ALTER TABLE jobsup.jobs SET (autovacuum_enabled = false)")
        sides = list(TRIGGER_SIDES)
        try:
            for number in range(runs):
                turn = sides[number % len(sides) :] + sides[: number % len(sides)]
                for side in turn:
                    dropped = TRIGGER_SIDES[side]
                    for name in dropped:
                        conn.execute(f"DROP TRIGGER {name} ON jobsup.jobs")
                    try:
                        figures[side].append(claim_complete_us(conn))
                    finally:
                        for name in dropped:
                            conn.execute(definitions[name])
                print(f"trigger run {number + 1}: " + ", ".join(f"{side} {figures[side][-1]:.2f} µs" for side in sides))
        finally:
            conn.execute("ALTER TABLE jobsup.jobs RESET (autovacuum_enabled)")
    median = {side: statistics.median(values) for side, values in figures.items()}
    with_us = median["with"]
    print(f"\na claim and an outcome write per job, {TRIGGER_JOBS:,} jobs 100 at a time, median of {runs} runs:")
    print(f"  with both triggers {with_us:.2f} µs")
    for side in sides[1:]:
        cost = with_us - median[side]
        print(f"  {side} {median[side]:.2f} µs: what it dropped costs {cost:.2f} µs ({cost / median[side]:.1%})")
    return {
        "trigger_with_us": with_us,
        "trigger_without_finished_us": median["without jobs_finished"],
        "trigger_without_row_triggers_us": median["without row triggers"],
    }


# --- noop --------------------------------------------------------------------------------------------


def noop(dsn: str | None, pairs: int, base: Path, commit: str, jobs: int) -> dict[str, float]:
    """No-op jobs drained beside the release before workflows (benchmarks/bench_beside.py)."""
    return bench_beside.pairs(dsn, pairs, base, commit, jobs, procs=8)


def main() -> int:
    parser = bench_parser(__doc__, 15)
    parser.set_defaults(procs=2)
    parser.add_argument("--only", default="fanin,chain", help="comma-separated subset of fanin,chain,trigger,noop")
    parser.add_argument("--members", type=int, default=10_000, help="members of the fan-in (default 10,000)")
    parser.add_argument("--samples", type=int, default=10, help="timed non-last and plain writes per fan-in run")
    parser.add_argument("--chains", default="1x200,20x50", help="COUNTxLENGTH of each chain run (default 1x200,20x50)")
    parser.add_argument("--pickups", type=int, default=200, help="fresh jobs timed beside the chains (default 200)")
    parser.add_argument("--pairs", type=int, default=10, help="alternating pairs of the noop mode (default 10)")
    parser.add_argument("--jobs", type=int, default=100_000, help="no-op jobs per drain of the noop mode")
    parser.add_argument("--base", default="/tmp/base", help="the clone of --base-commit (made when missing)")
    parser.add_argument("--base-commit", default=BASE_COMMIT, help=f"the release before (default {BASE_COMMIT})")
    args = parser.parse_args()
    try:
        only = {name.strip() for name in args.only.split(",") if name.strip()}
        if not only or only - {"fanin", "chain", "trigger", "noop"}:
            raise BadInput(f"--only takes a comma-separated subset of fanin,chain,trigger,noop, not {args.only!r}")
        specs = chain_specs(args.chains)
        if min(args.samples, args.pickups, args.runs, args.pairs, args.jobs) < 1 or args.members <= args.samples:
            raise BadInput(
                "--members must exceed --samples, and --samples, --pickups, --runs, --pairs and --jobs be 1 or more"
            )
        figures: dict[str, float] = {}
        if only & {"fanin", "chain", "trigger"}:
            with scratch.empty(args.dsn, "jobsup-bench-workflows-") as dsn:
                if "fanin" in only:
                    figures.update(fanin(dsn, args.runs, args.members, args.samples))
                if "chain" in only:
                    figures.update(chain(dsn, args.procs, specs, args.pickups))
                if "trigger" in only:
                    figures.update(trigger(dsn, args.runs))
        if "noop" in only:
            figures.update(noop(args.dsn, args.pairs, Path(args.base), args.base_commit, args.jobs))
    except BadInput as exc:
        print(f"bench_workflows: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
