"""benchmarks/bench_limits.py's claim mode, so that it cannot rot: it times the claim of limited jobs,
prints its figures, and leaves no job and no limit behind."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg

from .helpers import ROOT, cli_env


def test_claim_times_the_claim_of_limited_jobs_and_leaves_nothing(dsn, tmp_path):
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_limits", "--dsn", dsn, "--only", "claim", "--runs", "1"]
        + ["--json", str(out)],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "claim of limited jobs, 200,000 ready: 1 in " in result.stdout
    figures = json.loads(out.read_text())
    assert set(figures) == {"claim_1_ms", "claim_10_ms", "claim_100_ms"} and all(v > 0 for v in figures.values())
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM jobsup.limits WHERE limited").fetchone() == (0,)
