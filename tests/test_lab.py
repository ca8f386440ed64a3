"""examples/lab.py end to end: the original design's lab run through a real supervisor."""

import os
import subprocess
import sys

import pytest

from .helpers import ROOT, cli_env

pytestmark = pytest.mark.slow  # examples/lab.py starts its own supervisors


def test_the_lab_prints_its_five_results_with_exactly_518_handler_calls(server_dsn):
    env = cli_env(JOBSUP_DSN=server_dsn, JOBSUP_LAB_DB=f"jobsup_lab_{os.getpid()}")
    result = subprocess.run(
        [sys.executable, "examples/lab.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line[:2] for line in lines] == ["1.", "2.", "3.", "4.", "5."]
    assert "496 done, 4 dead" in lines[0] and "518 handler calls" in lines[0]
