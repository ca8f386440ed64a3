"""Every command that prints, its standard output closed early (`jobsup stats | head -c 1`): it stops
quietly, no traceback and nothing else on stderr, and exits 141 (128 + SIGPIPE) when a write failed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from jobsup import client
from jobsup.cli import COMMANDS

from .helpers import ROOT, cli_env

pytestmark = pytest.mark.slow  # dozens of CLI subprocesses

EXIT_BROKEN_PIPE = 141

# Commands that report trouble they find with exit 1 (doctor's warnings, check's crossed thresholds):
# when the whole output fits in the pipe before the reader leaves, that code stands.
REPORTS_WITH_EXIT_1 = {"doctor", "check"}


def invocations(dsn: str, data_dir: Path | None, ids: list[int]) -> list[tuple[str, list[str]]]:
    """(command, a cheap invocation of it that prints) for every command of jobsup."""
    db = ["--dsn", dsn]
    cases = [
        ("migrate", ["migrate", *db]),
        ("enqueue", ["enqueue", "k", *db]),
        ("stats", ["stats", *db]),
        ("stats", ["stats", "--json", *db]),
        ("requeue-dead", ["requeue-dead", *db]),
        # the embedded server of the tests, or (the tests on JOBSUP_TEST_DSN) its help
        ("db", ["db", "url", "--data-dir", str(data_dir)] if data_dir else ["db", "--help"]),
        ("prune", ["prune", "--dry-run", *db]),
        ("prune", ["prune", "--dry-run", "--json", *db]),
        ("doctor", ["doctor", *db]),
        ("doctor", ["doctor", "--json", *db]),
        ("cron", ["cron", "list", *db]),
        ("cancel", ["cancel", "--kind", "x", *db]),
        ("pause", ["pause", "q", *db]),
        ("resume", ["resume", "q", *db]),
        ("retry", ["retry", "--id", *map(str, ids), *db]),
        ("check", ["check", *db]),
        ("check", ["check", "--json", *db]),
        ("limit", ["limit", *db]),
        ("limit", ["limit", "--json", *db]),
        ("explain", ["explain", str(ids[0]), *db]),
        ("workflow", ["workflow", *db]),
        ("workflow", ["workflow", "--json", *db]),
        ("explain", ["explain", str(ids[0]), "--json", *db]),
        # these run until stopped (or, bench, for a while): their help is what prints at once
        ("start", ["start", "--help"]),
        ("top", ["top", "--help"]),
        ("bench", ["bench", "--help"]),
        ("metrics", ["metrics", "--help"]),
        ("web", ["web", "--help"]),
        ("--help", ["--help"]),
    ]
    missing = set(COMMANDS) - {name for name, _ in cases}
    assert not missing, f"give these commands an invocation here: {sorted(missing)}"
    return cases


@pytest.fixture
def filled(dsn, conn) -> list[int]:
    """Enough jobs that the commands print more than a line: many kinds for stats, 60 jobs of kind x
    for cancel; the ids of 60 others for retry."""
    client.enqueue_many(conn, [{"kind": f"kind-{n:03d}", "payload": {"n": n}} for n in range(120)])
    client.enqueue_many(conn, [{"kind": "x"} for _ in range(60)])
    return [job_id for job_id in client.enqueue_many(conn, [{"kind": "r"} for _ in range(60)]) if job_id]


def _spawn(args: list[str], stdout: int, stderr) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jobsup", *args], cwd=ROOT, env=cli_env(), stdout=stdout, stderr=stderr
    )


def _in_batches(cases: list, run, size: int = 6) -> None:
    """`run(batch)` on a few cases at a time: two cores are shared with other work."""
    for start in range(0, len(cases), size):
        run(cases[start : start + size])


def test_every_command_is_quiet_when_its_stdout_is_already_closed(dsn, filled, pg_data_dir):
    """The reader is gone before the command writes anything: every write fails, deterministically."""
    failures = []

    def run(batch):
        procs = []
        for name, args in batch:
            read_end, write_end = os.pipe()
            os.close(read_end)  # no reader: the first write (or the final flush) gets EPIPE
            err = tempfile.TemporaryFile()
            procs.append((name, args, _spawn(args, write_end, err), err))
            os.close(write_end)
        for _name, args, proc, err in procs:
            code = proc.wait(timeout=180)
            err.seek(0)
            noise = err.read().decode(errors="replace")
            err.close()
            if code != EXIT_BROKEN_PIPE or noise:
                failures.append((args, code, noise))

    _in_batches(invocations(dsn, pg_data_dir, filled), run)
    assert not failures, "\n".join(f"{args}: exit {code}, stderr {noise!r}" for args, code, noise in failures)


def test_every_command_is_quiet_when_its_reader_leaves_after_one_byte(dsn, filled, pg_data_dir):
    """`jobsup ... | head -c 1`: the reader takes the first byte and closes the pipe."""
    failures = []

    def run(batch):
        procs = []
        for name, args in batch:
            err = tempfile.TemporaryFile()
            procs.append((name, args, _spawn(args, subprocess.PIPE, err), err))
        for name, args, proc, err in procs:
            assert proc.stdout is not None
            first = os.read(proc.stdout.fileno(), 1)
            proc.stdout.close()
            code = proc.wait(timeout=180)
            err.seek(0)
            noise = err.read().decode(errors="replace")
            err.close()
            # all of it may have fit in the pipe before the reader left: then the command's own code
            allowed = {0, EXIT_BROKEN_PIPE} | ({1} if name in REPORTS_WITH_EXIT_1 else set())
            if len(first) != 1 or code not in allowed or noise:
                failures.append((args, code, noise))

    _in_batches(invocations(dsn, pg_data_dir, filled), run)
    assert not failures, "\n".join(f"{args}: exit {code}, stderr {noise!r}" for args, code, noise in failures)


def test_a_closed_stdout_with_a_refusal_still_says_why_on_stderr(dsn):
    """Only the broken pipe is silenced: an error on stderr still shows, with its own exit code."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    with tempfile.TemporaryFile() as err:
        proc = _spawn(["enqueue", "k", "--delay", "soon", "--dsn", dsn], write_end, err)
        os.close(write_end)
        assert proc.wait(timeout=60) == 2
        err.seek(0)
        assert b"not a duration" in err.read()


def test_only_a_broken_stdout_is_silenced_not_another_pipe(monkeypatch):
    """A BrokenPipeError from another pipe (a worker's, a socket's) is a fault to show, not a reader
    that left: main() lets it through while its standard output still has a reader."""
    import jobsup.cli.migrate
    from jobsup.cli import main

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(jobsup.cli.migrate, "run", broken)
    for reader_left in (False, True):
        read_end, write_end = os.pipe()
        with open(write_end, "w") as out, open(read_end, "rb") as reader:
            monkeypatch.setattr(sys, "stdout", out)
            if reader_left:
                reader.close()
                assert main(["migrate"]) == EXIT_BROKEN_PIPE
            else:
                with pytest.raises(BrokenPipeError):
                    main(["migrate"])
