"""benchmarks/bench_beside.py at a tiny size, so that it cannot rot: one pair of drains, this checkout
beside a clone of its own HEAD (sharing this venv, so nothing is installed), each side's figures counted
and its databases left behind dropped; and its refusals in one line."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from benchmarks import bench_beside

from .helpers import ROOT, cli_env


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_beside", *args],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


@pytest.mark.slow  # two real `jobsup start`, one on each side
@pytest.mark.parametrize("limit", [None, 4])  # 4: each side's `jobsup limit` sets it, claim_limited drains
def test_one_pair_drains_both_sides_and_counts_their_cpu(server_dsn, tmp_path, limit):
    base = tmp_path / "base"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(base)], check=True)
    subprocess.run(["git", "-C", str(base), "checkout", "-q", head()], check=True)
    # The base side runs this venv's Python from its own checkout: `python -m jobsup` there imports the
    # jobsup of its working directory, the clone's.
    (base / ".venv").symlink_to(Path(sys.executable).parent.parent)
    out = tmp_path / "figures.json"
    result = bench(
        "--base", str(base), "--base-commit", head(), "--pairs", "1", "--jobs", "3000", "--procs", "2",
        "--dsn", server_dsn, "--json", str(out), *([] if limit is None else ["--limit", str(limit)]),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "pair 1 (this first)" in result.stdout and "CPU ms/1,000" in result.stdout
    assert ("3,000 noop jobs limited to 4 on" in result.stdout) == (limit is not None)
    figures = json.loads(out.read_text())
    for side in ("this", "base"):
        assert figures[f"{side}_jobs_per_s"] > 0
        # Both the supervisor with its workers and the server spent CPU on 3,000 jobs: a count that
        # missed the workers (the fork server's children) or the server's backends would read 0.
        assert figures[f"{side}_supervisor_cpu_ms"] > 0 and figures[f"{side}_server_cpu_ms"] > 0
    assert 0.2 < figures["jobs_per_s_ratio"] < 5  # the same code on both sides
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'jobsup_bench_beside%'").fetchall()
        assert left == []


@pytest.mark.parametrize(
    "args, says",
    [
        (["--base", "/nonexistent-base", "--base-commit", "HEAD", "--pairs", "0"], "--pairs, --jobs and --procs"),
        (["--base", "/tmp", "--base-commit", "not-a-commit"], "git -C"),
        (["--base", "/tmp", "--base-commit", "HEAD", "--this", "/tmp"], "--this and --this-commit go together"),
        (["--base", "/tmp", "--base-commit", "HEAD", "--limit", "0"], "--limit must be 1 or more"),
    ],
)
def test_bad_flags_are_refused_in_one_line(args, says):
    result = bench(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and says in result.stderr


def test_a_base_that_is_not_a_clone_at_the_commit_is_refused_and_left_alone(tmp_path):
    (tmp_path / "kept").write_text("not a clone")
    result = bench("--base", str(tmp_path), "--base-commit", "HEAD", "--pairs", "1")
    assert result.returncode == 2 and result.stdout == ""
    assert "is not a clone of jobsup checked out at HEAD" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["kept"]


def test_the_ratios_say_above_one_for_faster_and_cheaper():
    # The module's doctest (pair_ratios): pytest collects doctests from jobsup/ alone.
    failed, tried = doctest.testmod(bench_beside)
    assert tried >= 1 and failed == 0
