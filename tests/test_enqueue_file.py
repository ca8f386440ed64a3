"""`jobsup enqueue --file` of a large file: the progress bar moves from the first line read (reading
and checking the file is most of the time), and the time it reports is the whole command's."""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import time

import pytest

from .helpers import cli_env, wait_for
from .terminal import Terminal

pytestmark = pytest.mark.slow  # the CLI on a terminal of its own


def _lines(start: int, n: int) -> bytes:
    return "".join(json.dumps({"kind": "bulk", "payload": {"n": i}}) + "\n" for i in range(start, start + n)).encode()


def _writer(path) -> int:
    """The writing end of the FIFO `path`, once the command has opened it to read."""

    def opened() -> int | None:
        try:
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader yet
                return None
            raise

    fd = wait_for(opened, timeout=60, message="the command opening the file")
    os.set_blocking(fd, True)
    return fd


def test_the_bar_moves_from_the_first_line_read_and_the_whole_time_is_reported(dsn, conn, tmp_path):
    # The file is a FIFO: its first lines come, then nothing until the bar is on the screen. A command
    # that drew nothing before reading the whole file would never draw it.
    fifo = tmp_path / "jobs.jsonl"
    os.mkfifo(fifo)
    term = Terminal(
        [sys.executable, "-m", "jobsup", "enqueue", "--file", str(fifo), "--dsn", dsn], cli_env(), size=(120, 24)
    )
    try:
        fd = _writer(fifo)
        try:
            os.write(fd, _lines(0, 2_000))
            first = time.monotonic()
            term.wait_for(b"reading and checking", timeout=30)
            held = time.monotonic() - first  # the file was still open, all that time
            os.write(fd, _lines(2_000, 3_000))
        finally:
            os.close(fd)
        term.wait_for(b"enqueued 5000 jobs", timeout=60)
        term.read(0.5)
    finally:
        term.close()
    said = re.search(rb"enqueued 5000 jobs in ([\d.]+)s \(([\d.]+)s of it reading and checking\)", term.seen)
    assert said is not None, term.seen[-500:]
    took, checking = float(said[1]), float(said[2])
    assert checking >= held - 0.01 and took >= checking, (took, checking, held)
    assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone() == (5000,)


def test_json_gives_the_whole_time_and_the_part_spent_checking(dsn, tmp_path):
    from .helpers import jobsup

    path = tmp_path / "jobs.jsonl"
    path.write_bytes(_lines(0, 100))
    done = jobsup("enqueue", "--file", str(path), "--json", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["enqueued"] == 100 and said["skipped"] == 0
    assert 0 < said["checking_seconds"] <= said["seconds"], said
