"""The queue core's speed, each figure beside the same work done in plain SQL in the same run.

    python -m benchmarks.bench_queue [--dsn DSN] [--runs N] [--jobs N] [--json PATH]

Without --dsn it starts its own embedded PostgreSQL in a temporary directory and stops it at the end.
Either way it works in a scratch database of its own, dropped at the end. Measured:

  bulk          enqueue_many of --jobs jobs in one call     vs  one COPY into the plain table
  one-by-one    enqueue + commit, --single-jobs times       vs  INSERT + commit
  claim+complete, --procs processes, batches of 1, 10, 100  vs  UPDATE … SKIP LOCKED + UPDATE … = ANY,
                on the minimal table and on a twin of jobsup's

The plain table is the least a queue needs: bench_plain.jobs(id, kind, payload, status, attempts, run_at,
locked_until) with a partial index on ready jobs. The twin, bench_plain.twin, is jobsup.jobs copied with
its columns and indexes (no trigger), and its plain SQL does the same work as jobsup's claim and
complete: the same columns set and returned, the same order, the completion fenced by holder and
attempt. Only the per-kind totals, which jobsup keeps for its console, are left to jobsup. The
claim+complete target is judged against the twin, "the same work done in plain SQL"; the minimal table
shows what the queue's bookkeeping itself costs. Every run starts from empty tables (claim runs from
freshly loaded, VACUUM ANALYZEd, checkpointed ones), and jobsup and plain SQL take turns going first.
The machine is usually shared, so the table shows medians, and the ratio is the median of the per-run
ratios jobsup/plain: both halves of a ratio ran under the same load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

from jobsup import client
from jobsup.db import embedded, lifecycle
from jobsup.db.migrate import migrate

# The targets: bulk enqueue in jobs/s, and claim+complete as a fraction of plain SQL.
BULK_TARGET = 60_000
CLAIM_RATIO_TARGET = 0.8
BATCHES = (1, 10, 100)
KIND = "bench"
QUEUE = "default"
LEASE = 600.0  # seconds: no lease runs out during a run

PLAIN_SCHEMA = """
DROP SCHEMA IF EXISTS bench_plain CASCADE;
CREATE SCHEMA bench_plain;
CREATE TABLE bench_plain.jobs (
    id            bigserial   PRIMARY KEY,
    kind          text        NOT NULL,
    payload       jsonb       NOT NULL,
    status        text        NOT NULL DEFAULT 'queued',
    attempts      int         NOT NULL DEFAULT 0,
    run_at        timestamptz NOT NULL DEFAULT now(),
    locked_until  timestamptz
);
CREATE INDEX jobs_ready_idx ON bench_plain.jobs (run_at, id) WHERE status = 'queued';
CREATE TABLE bench_plain.twin (LIKE jobsup.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                               INCLUDING INDEXES INCLUDING IDENTITY);
"""
PLAIN_COPY = "COPY bench_plain.jobs (kind, payload) FROM STDIN"
PLAIN_INSERT = "INSERT INTO bench_plain.jobs (kind, payload) VALUES (%s, %s::jsonb) RETURNING id"
PLAIN_CLAIM = """
UPDATE bench_plain.jobs SET status = 'running', attempts = attempts + 1,
       locked_until = now() + make_interval(secs => %s::float8)
WHERE id IN (SELECT id FROM bench_plain.jobs WHERE status = 'queued' AND run_at <= now()
             ORDER BY run_at, id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, kind, payload, attempts
"""
PLAIN_COMPLETE = "UPDATE bench_plain.jobs SET status = 'done', locked_until = NULL WHERE id = ANY(%s)"
TWIN_CLAIM = """
UPDATE bench_plain.twin SET status = 'running', attempts = attempts + 1, locked_by = %s,
       locked_until = now() + make_interval(secs => %s::float8), started_at = now()
WHERE id IN (SELECT id FROM bench_plain.twin WHERE status = 'queued' AND queue = 'default' AND run_at <= now()
             ORDER BY priority DESC, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, kind, payload, queue, attempts, max_attempts, priority, run_at, created_at
"""
TWIN_COMPLETE = """
UPDATE bench_plain.twin t SET status = 'done', done_at = now(), locked_until = NULL
FROM unnest(%s::bigint[], %s::int[]) AS o(id, attempt)
WHERE t.id = ANY(%s::bigint[]) AND t.id = o.id AND t.attempts = o.attempt
  AND t.status = 'running' AND t.locked_by = %s
"""
RESET = "TRUNCATE jobsup.jobs, jobsup.kind_totals, bench_plain.jobs, bench_plain.twin RESTART IDENTITY"


def payload(n: int) -> dict[str, Any]:
    return {"n": n, "to": f"user{n}@example.com", "template": "welcome"}


# --- enqueue -------------------------------------------------------------------------------------


def bulk_jobsup(conn: psycopg.Connection, n: int) -> float:
    jobs = [{"kind": KIND, "payload": payload(i)} for i in range(n)]
    start = time.perf_counter()
    ids = client.enqueue_many(conn, jobs)
    conn.commit()
    elapsed = time.perf_counter() - start
    assert len(ids) == n and None not in ids
    return n / elapsed


def bulk_plain(conn: psycopg.Connection, n: int) -> float:
    payloads = [payload(i) for i in range(n)]
    start = time.perf_counter()
    with conn.cursor() as cur, cur.copy(PLAIN_COPY) as copy:
        for p in payloads:
            copy.write_row((KIND, json.dumps(p, separators=(",", ":"))))
    conn.commit()
    return n / (time.perf_counter() - start)


def single_jobsup(conn: psycopg.Connection, n: int) -> float:
    payloads = [payload(i) for i in range(n)]
    start = time.perf_counter()
    for p in payloads:
        client.enqueue(conn, KIND, p)
        conn.commit()
    return n / (time.perf_counter() - start)


def single_plain(conn: psycopg.Connection, n: int) -> float:
    payloads = [payload(i) for i in range(n)]
    start = time.perf_counter()
    with conn.cursor() as cur:
        for p in payloads:
            cur.execute(PLAIN_INSERT, (KIND, json.dumps(p, separators=(",", ":"))))
            cur.fetchone()
            conn.commit()
    return n / (time.perf_counter() - start)


# --- claim + complete, in worker processes -------------------------------------------------------


def _step_jobsup(conn: psycopg.Connection, batch: int, locked_by: str) -> int:
    jobs = lifecycle.claim(conn, [QUEUE], batch, locked_by, LEASE)
    if not jobs:
        return 0
    done = lifecycle.complete(conn, [(j.id, j.attempts) for j in jobs], locked_by)
    assert len(done) == len(jobs), (len(done), len(jobs))
    return len(done)


def _step_plain(conn: psycopg.Connection, batch: int, locked_by: str) -> int:
    with conn.cursor() as cur:
        rows = cur.execute(PLAIN_CLAIM, (LEASE, batch)).fetchall()
        if not rows:
            return 0
        cur.execute(PLAIN_COMPLETE, ([r[0] for r in rows],))
        assert cur.rowcount == len(rows)
    return len(rows)


def _step_twin(conn: psycopg.Connection, batch: int, locked_by: str) -> int:
    with conn.cursor() as cur:
        rows = cur.execute(TWIN_CLAIM, (locked_by, LEASE, batch)).fetchall()
        if not rows:
            return 0
        ids = [r[0] for r in rows]
        cur.execute(TWIN_COMPLETE, (ids, [r[4] for r in rows], ids, locked_by))
        assert cur.rowcount == len(rows)
    return len(rows)


STEPS: dict[str, Callable[[psycopg.Connection, int, str], int]] = {
    "jobsup": _step_jobsup,
    "plain": _step_plain,
    "twin": _step_twin,
}


def _worker(dsn: str, commands: Any, results: Any, barrier: Any) -> None:
    """One claimer: its own autocommit connection, kept across runs; claims until nothing is left."""
    conn = psycopg.connect(dsn, autocommit=True)
    locked_by = f"bench-{os.getpid()}"
    try:
        while (command := commands.get()) is not None:
            step, batch = STEPS[command[0]], command[1]
            barrier.wait()
            count = 0
            while got := step(conn, batch, locked_by):
                count += got
            results.put((count, time.perf_counter()))
    finally:
        conn.close()


class Claimers:
    """`procs` spawned worker processes that claim and complete together when told to."""

    def __init__(self, dsn: str, procs: int) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.barrier = ctx.Barrier(procs + 1)
        self.commands = [ctx.Queue() for _ in range(procs)]
        self.procs = [
            ctx.Process(target=_worker, args=(dsn, q, self.results, self.barrier), daemon=True) for q in self.commands
        ]
        for p in self.procs:
            p.start()

    def run(self, which: str, batch: int, expected: int) -> float:
        for q in self.commands:
            q.put((which, batch))
        self.barrier.wait(timeout=120)  # every worker connected and ready: the clock starts
        start = time.perf_counter()
        counts, ends = zip(*(self.results.get(timeout=600) for _ in self.procs), strict=True)  # (count, end) pairs
        if sum(counts) != expected:
            raise RuntimeError(f"{which} batch {batch}: claimed {sum(counts)} jobs of {expected}")
        return expected / (max(ends) - start)

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)


def load_for_claim(conn: psycopg.Connection, n: int) -> None:
    """`n` ready jobs in each table, statistics fresh and dirty pages flushed, so runs are comparable."""
    conn.execute(RESET)
    for start in range(0, n, 10_000):
        client.enqueue_many(conn, [{"kind": KIND, "payload": payload(i)} for i in range(start, min(n, start + 10_000))])
    with conn.cursor() as cur, cur.copy(PLAIN_COPY) as copy:
        for i in range(n):
            copy.write_row((KIND, json.dumps(payload(i), separators=(",", ":"))))
    conn.execute("INSERT INTO bench_plain.twin (kind, payload) SELECT kind, payload FROM bench_plain.jobs ORDER BY id")
    conn.execute("VACUUM ANALYZE jobsup.jobs, jobsup.kind_totals, bench_plain.jobs, bench_plain.twin")
    conn.execute("CHECKPOINT")


def check_done(conn: psycopg.Connection, which: str, n: int) -> None:
    table = {"jobsup": "jobsup.jobs", "plain": "bench_plain.jobs", "twin": "bench_plain.twin"}[which]
    done = conn.execute(f"SELECT count(*) FROM {table} WHERE status = 'done'").fetchone()[0]
    if done != n:
        raise RuntimeError(f"{which}: {done} jobs done of {n}")
    if which == "jobsup":
        total = conn.execute("SELECT coalesce(sum(done), 0) FROM jobsup.kind_totals").fetchone()[0]
        if total != n:
            raise RuntimeError(f"jobsup.kind_totals counts {total} jobs done of {n}")


# --- the whole benchmark -------------------------------------------------------------------------


def measure(dsn: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {}

    def record(name: str, which: str, value: float) -> None:
        results.setdefault(name, {"jobsup": [], "plain": [], "twin": []})[which].append(value)

    admin = psycopg.connect(dsn, autocommit=True)
    tx = psycopg.connect(dsn)  # not autocommit: the enqueue measurements commit themselves
    claimers = Claimers(dsn, args.procs) if any(m.startswith("claim") for m in args.only) else None
    try:
        for run in range(args.runs):
            # Take turns going first, so neither side always meets a warmer (or busier) server.
            order = ("jobsup", "plain") if run % 2 == 0 else ("plain", "jobsup")
            if "bulk" in args.only:
                for which in order:
                    admin.execute(RESET)
                    admin.execute("CHECKPOINT")
                    fn = bulk_jobsup if which == "jobsup" else bulk_plain
                    record("bulk enqueue", which, fn(tx, args.jobs))
            if "single" in args.only:
                admin.execute(RESET)
                for which in order:
                    fn = single_jobsup if which == "jobsup" else single_plain
                    record("one-by-one enqueue", which, fn(tx, args.single_jobs))
            for batch in BATCHES:
                if f"claim{batch}" not in args.only:
                    continue
                n = args.claim1_jobs if batch == 1 else args.claim_jobs
                sides = ("jobsup", "plain", "twin")
                for which in sides[run % 3 :] + sides[: run % 3]:
                    load_for_claim(admin, n)
                    assert claimers is not None
                    record(f"claim+complete, batch {batch}", which, claimers.run(which, batch, n))
                    check_done(admin, which, n)
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)
    finally:
        if claimers is not None:
            claimers.close()
        tx.close()
        admin.close()
    return results


def summarise(results: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    rows = []
    for name, runs in results.items():
        # Every run measures each side once: the lists pair up run by run.
        ratios = [j / p for j, p in zip(runs["jobsup"], runs["plain"], strict=True)]
        row = {
            "measurement": name,
            "jobsup_jobs_per_s": statistics.median(runs["jobsup"]),
            "plain_jobs_per_s": statistics.median(runs["plain"]),
            "ratio": statistics.median(ratios),
            "runs": {"jobsup": runs["jobsup"], "plain": runs["plain"], "ratio": ratios},
        }
        if runs["twin"]:
            same = [j / t for j, t in zip(runs["jobsup"], runs["twin"], strict=True)]
            row.update(twin_jobs_per_s=statistics.median(runs["twin"]), ratio_same_work=statistics.median(same))
            row["runs"].update(twin=runs["twin"], ratio_same_work=same)
        if name == "bulk enqueue":
            row["target"] = f">= {BULK_TARGET:,} jobs/s"
            row["met"] = row["jobsup_jobs_per_s"] >= BULK_TARGET
        elif name.startswith("claim"):
            row["target"] = f"same-work ratio >= {CLAIM_RATIO_TARGET}"
            row["met"] = row["ratio_same_work"] >= CLAIM_RATIO_TARGET
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\njobsup vs plain SQL: median of {args.runs} runs; each ratio = median of per-run jobsup/plain;"
        "\n'minimal' is the least a queue needs, 'same work' the twin of jobsup's table and writes\n"
    )
    header = (
        f"{'measurement':<28} {'jobsup jobs/s':>14} {'minimal':>9} {'ratio':>6} {'same work':>10} {'ratio':>6}  target"
    )
    print(header)
    print("-" * len(header) + "-" * 20)
    for r in rows:
        target = r.get("target", "")
        if target:
            target += "  " + ("met" if r["met"] else "MISSED")
        same = (
            f"{r['twin_jobs_per_s']:>10,.0f} {r['ratio_same_work']:>6.2f}"
            if "twin_jobs_per_s" in r
            else f"{'':>10} {'':>6}"
        )
        print(
            f"{r['measurement']:<28} {r['jobsup_jobs_per_s']:>14,.0f} {r['plain_jobs_per_s']:>9,.0f} "
            f"{r['ratio']:>6.2f} {same}  {target}"
        )


def with_dbname(dsn: str, dbname: str) -> str:
    return conninfo.make_conninfo(dsn, dbname=dbname)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_queue", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn",
        help="a server to use (a scratch database is created on it and dropped); "
        "default: an embedded PostgreSQL in a temporary directory",
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of every measurement (default 5)")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per bulk enqueue (default 100000)")
    parser.add_argument(
        "--single-jobs", type=int, default=2_000, help="jobs enqueued one transaction each (default 2000)"
    )
    parser.add_argument(
        "--claim-jobs",
        type=int,
        default=20_000,
        help="jobs claimed and completed per run at batch 10 and 100 (default 20000)",
    )
    parser.add_argument(
        "--claim1-jobs", type=int, default=5_000, help="jobs claimed and completed per run at batch 1 (default 5000)"
    )
    parser.add_argument("--procs", type=int, default=8, help="claiming processes (default 8)")
    parser.add_argument(
        "--only",
        default="bulk,single,claim1,claim10,claim100",
        help="comma-separated subset of bulk,single,claim1,claim10,claim100",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures, every run's too, as JSON")
    args = parser.parse_args(argv)
    args.only = set(args.only.split(","))

    data_dir: Path | None = None
    if args.dsn:
        server_dsn = args.dsn
    else:
        # Short: the server's Unix socket lives in here, and socket paths are limited to ~100 bytes.
        data_dir = Path(tempfile.mkdtemp(prefix="jsb-", dir="/tmp")) / "pg"
        print(f"starting an embedded PostgreSQL in {data_dir}", file=sys.stderr, flush=True)
        server_dsn = embedded.ensure_running(data_dir)
    dbname = f"jobsup_bench_{os.getpid()}"
    try:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
            version = admin.execute("SHOW server_version").fetchone()[0]
        dsn = with_dbname(server_dsn, dbname)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                migrate(conn)
                conn.execute(PLAIN_SCHEMA.encode())
            results = measure(dsn, args)
        finally:
            with psycopg.connect(server_dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
    finally:
        if data_dir is not None:
            embedded.stop(data_dir)
            shutil.rmtree(data_dir.parent, ignore_errors=True)

    rows = summarise(results)
    print_table(rows, args)
    if args.json:
        report = {
            "postgres": version,
            "runs": args.runs,
            "jobs": args.jobs,
            "single_jobs": args.single_jobs,
            "claim_jobs": args.claim_jobs,
            "claim1_jobs": args.claim1_jobs,
            "procs": args.procs,
            "cpus": os.cpu_count(),
            "results": rows,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r.get("met", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
