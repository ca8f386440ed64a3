"""benchmarks/bench_workflows.py at tiny sizes, so that it cannot rot: each mode runs, checks what it
measures (a fan-in job released by its last member's write alone; every chain done), prints its figures
and stops its supervisor; bad flags are refused in one line. Its noop mode is benchmarks/bench_beside.py
(tests/test_bench_beside.py): its refusal of a base that is not one is tested here."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from benchmarks import bench_workflows
from jobsup.ops.bench import Sizes
from jobsup.supervisor.config import Config

from .helpers import ROOT, cli_env


def bench(*args: str, tmp: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """The benchmark run with `args`; its temporary files (a supervisor's log) in `tmp`."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_workflows", *args],
        cwd=ROOT,
        env=cli_env(TMPDIR=str(tmp)) if tmp else cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_fanin_times_the_last_members_write_and_leaves_no_job(dsn, tmp_path):
    out = tmp_path / "figures.json"
    result = bench(
        "--dsn", dsn, "--only", "fanin", "--members", "40", "--samples", "3", "--runs", "2", "--json", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("fanin run ") == 2 and "last / plain" in result.stdout
    figures = json.loads(out.read_text())
    assert set(figures) == {"fanin_last_ms", "fanin_member_ms", "plain_ms", "fanin_last_vs_plain"}
    assert all(value > 0 for value in figures.values())
    with psycopg.connect(dsn) as conn:  # each run cleared what it made
        assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone() == (0,)


@pytest.mark.slow  # 60,000 jobs claimed and completed
def test_trigger_times_each_side_and_puts_the_triggers_back(dsn, tmp_path):
    out = tmp_path / "figures.json"
    result = bench("--dsn", dsn, "--only", "trigger", "--runs", "1", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "trigger run 1:" in result.stdout and "without row triggers" in result.stdout
    figures = json.loads(out.read_text())
    assert set(figures) == {"trigger_with_us", "trigger_without_finished_us", "trigger_without_row_triggers_us"}
    assert all(value > 0 for value in figures.values())
    with psycopg.connect(dsn) as conn:
        # The runs without them dropped them in this database: they are back, as the migrations made them.
        definitions = dict(
            conn.execute(
                "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger"
                " WHERE tgname IN ('jobs_finished', 'jobs_claim_protocol')"
            ).fetchall()
        )
        assert set(definitions) == {"jobs_finished", "jobs_claim_protocol"}
        assert all("AFTER UPDATE OF status" in text for text in definitions.values()), definitions
        assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone() == (0,)
        options = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'jobsup.jobs'::regclass").fetchone()
        assert options is not None and not any(o.startswith("autovacuum_enabled") for o in options[0])


@pytest.mark.slow  # a real `jobsup start`
def test_chain_runs_every_chain_on_a_supervisor_it_stops(dsn, tmp_path):
    out = tmp_path / "figures.json"
    result = bench(
        "--dsn", dsn, "--only", "chain", "--chains", "1x5,3x4", "--pickups", "5", "--json", str(out), tmp=tmp_path
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    for name in ("chain_1x5", "chain_3x4"):
        assert 0 < figures[f"{name}_p50_ms"] <= figures[f"{name}_p99_ms"]
        assert figures[f"{name}_from_start_p50_ms"] > 0 and figures[f"{name}_jobs_per_s"] > 0
    assert 0 < figures["pickup_p50_ms"] <= figures["pickup_p99_ms"]
    assert figures["flush_interval_ms"] == Config().flush_interval * 1000
    assert "3 chains on 2 workers" in result.stdout and "pickup plus one flush" in result.stdout
    with psycopg.connect(dsn) as conn:
        statuses = conn.execute("SELECT status, count(*) FROM jobsup.jobs GROUP BY status").fetchall()
        warmup = Sizes().pickup_warmup
        assert statuses == [("done", warmup + 5 + 5 + 3 * 4)]
        # A supervisor removes its row when it stops: none is left running.
        assert conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone() == (0,)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--only", "fanin,chains"], "--only takes a comma-separated subset of fanin,chain,trigger,noop"),
        (["--chains", "3y4"], "--chains takes COUNTxLENGTH items"),
        (["--chains", "2x1"], "--chains takes COUNTxLENGTH items"),
        (["--members", "3", "--samples", "3"], "--members must exceed --samples"),
        (["--only", "noop", "--pairs", "0"], "--pairs and --jobs be 1 or more"),
    ],
)
def test_bad_flags_are_refused_in_one_line(args, says):
    result = bench(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and says in result.stderr


def test_noop_refuses_a_base_that_is_not_a_clone_at_the_commit(tmp_path):
    (tmp_path / "kept").write_text("not a clone")
    result = bench("--only", "noop", "--pairs", "1", "--base", str(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "is not a clone of jobsup checked out at 0d1f1c0" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]  # nothing made in it


def test_the_benchmarks_doctests():
    failed, tried = doctest.testmod(bench_workflows)
    assert tried >= 1 and failed == 0
