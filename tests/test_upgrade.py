"""Upgrades without a stop, release by release: a supervisor and an enqueuer of an earlier release go on
running against today's schema with their own statements. One release for each migration from 0008 on
(the commit before it, whose statements met that migration) and 0.1.0, the first version: each
enqueues, claims, completes, fails and reaps as it did, and from schema 8 on claims jobs of a limited
kind through its claim_limited within their limit; a release before limits is refused at its first
claim of a limited job (SQLSTATE JS001), as migration 0008 says.

The statements are in tests/previous_release/ (each release's file holds what changed since the one
before), generated from each release's commit by `python -m tests.previous_release`; the parameters
are those its jobsup/db/lifecycle.py passed (psycopg ignores the keys a statement does not name, so one
set serves every release)."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from jobsup.db.lifecycle import CLAIM_REFUSED
from jobsup.db.migrate import LATEST
from jobsup.ops import limits

from .helpers import wait_for
from .previous_release import COPIES, REGENERATE, RELEASES, Release, copy_of, has_history, statements, text_of

OLD, REAPER = "old-a", "old-reaper"
META = {"tenant": "acme"}
BY_NAME = {release.name: release for release in RELEASES}


@pytest.fixture(params=[release.name for release in RELEASES])
def release(request: pytest.FixtureRequest) -> Release:
    return BY_NAME[request.param]


class Old:
    """A release's supervisor and enqueuer: its statements, with the parameters it passed."""

    def __init__(self, conn: psycopg.Connection, release: Release) -> None:
        self.conn, self.release = conn, release
        self.sql = statements(release)

    def enqueue(self, kind: str, n: int) -> int:
        params = {
            "queue": "default",
            "kind": kind,
            "payload": json.dumps({"n": n}),
            "priority": 0,
            "run_at": None,
            "delay": 0.0,
            "max_attempts": 3,
            "unique_key": None,
            "key": None,
            "meta": json.dumps(META),
        }
        return self.conn.execute(self.sql["enqueue"], params).fetchone()[0]

    def claim(self, lease: float = 30) -> list[tuple]:
        params = {
            "queues": ["default"],
            "after_priorities": [None],
            "after_run_ats": [None],
            "after_ids": [None],
            "limit": 100,
            "locked_by": OLD,
            "lease": lease,
            "kinds": None,
        }
        return self.conn.execute(self.sql["claim"], params).fetchall()

    def claim_limited(self, kinds: list[str]) -> list[tuple]:
        """The jobs claimed (a row without an id, which says when to wake, left out)."""
        params = {"kinds": kinds, "queues": ["default"], "limit": 100, "locked_by": OLD, "lease": 30}
        return [row for row in self.conn.execute(self.sql["claim_limited"], params) if row[0] is not None]

    def complete(self, jobs: list[tuple]) -> list[int]:
        params = {
            "ids": [j[0] for j in jobs],
            "attempts": [j[4] for j in jobs],
            "locked_by": OLD,
            "return_values": [json.dumps(j[2]["n"]) for j in jobs],
        }
        return sorted(r[0] for r in self.conn.execute(self.sql["complete"], params))

    def fail(self, jobs: list[tuple]) -> list[int]:
        params = {
            "ids": [j[0] for j in jobs],
            "attempts": [j[4] for j in jobs],
            "errors": [f"RuntimeError: {j[2]['n']} failed on purpose" for j in jobs],
            "tracebacks": [None for _ in jobs],
            "delays": [None for _ in jobs],
            "locked_by": OLD,
            "backoff_base": 0.0,  # the retry is due at once: the test needs no clock of its own
            "backoff_cap": 3600.0,
            "jitter": 0.0,
        }
        return sorted(r[0] for r in self.conn.execute(self.sql["fail"], params))

    def reap(self) -> list[int]:
        return sorted(r[0] for r in self.conn.execute(self.sql["reap"], {"reaper": REAPER, "limit": 1000}))


def jobs(conn: psycopg.Connection) -> dict[int, tuple[Any, ...]]:
    """id: (status, attempts, last_error, return_value)"""
    rows = conn.execute("SELECT id, status, attempts, last_error, return_value FROM jobsup.jobs")
    return {row[0]: row[1:] for row in rows}


def test_every_migration_from_0008_has_a_release_before_it():
    before = {release.schema + 1 for release in RELEASES if release.name.startswith("before_")}
    missing = [f"{v:04d}" for v in range(8, LATEST + 1) if v not in before]
    assert missing == [], (
        f"no upgrade test for migration {', '.join(missing)}: add a Release of the commit before it to"
        f" tests/previous_release/__init__.py and run `{REGENERATE}`"
    )
    assert all(release.path.exists() for release in RELEASES), f"run `{REGENERATE}`"


def test_each_release_file_is_what_its_commit_held(release):
    if not has_history(release.commit):
        pytest.skip(f"this clone lacks commit {release.commit[:12]} (a shallow clone)")
    assert release.path.read_text() == text_of(release), (
        f"tests/previous_release/{release.path.name} differs from its commit: run `{REGENERATE}`"
    )


@pytest.mark.parametrize("copy", COPIES, ids=[copy.name for copy in COPIES])
def test_each_whole_copy_is_what_its_commit_held(copy):
    if not has_history(copy.commit):
        pytest.skip(f"this clone lacks commit {copy.commit[:12]} (a shallow clone)")
    assert copy.path.read_text() == copy_of(copy), (
        f"tests/previous_release/{copy.path.name} differs from its commit: run `{REGENERATE}`"
    )


def test_an_earlier_release_runs_its_jobs_on_todays_schema(conn, release):
    """Four jobs of its own enqueue: two completed, one failed and retried, one whose lease runs out
    and which its reaper returns; the retries claimed again and completed. All done, counted so."""
    old = Old(conn, release)
    ids = [old.enqueue("k", n) for n in range(4)]
    claimed = old.claim(lease=0.5)
    assert sorted(j[0] for j in claimed) == ids
    assert [j[4] for j in claimed] == [1] * 4  # attempts, where every release's Job had it
    by_id = {j[0]: j for j in claimed}
    first, second, failing, lost = (by_id[i] for i in ids)

    assert old.complete([first, second]) == [first[0], second[0]]
    assert old.fail([failing]) == [failing[0]]
    wait_for(
        lambda: conn.execute("SELECT locked_until < now() FROM jobsup.jobs WHERE id = %s", (lost[0],)).fetchone()[0],
        message="the lost job's lease to run out",
    )
    assert old.reap() == [lost[0]]
    assert jobs(conn)[failing[0]][:3] == ("queued", 1, "RuntimeError: 2 failed on purpose")
    assert jobs(conn)[lost[0]][:3] == ("queued", 1, f"lease expired: {OLD} stopped renewing it")

    again = old.claim()
    assert sorted(j[0] for j in again) == [failing[0], lost[0]] and [j[4] for j in again] == [2, 2]
    assert old.complete(again) == [failing[0], lost[0]]
    ended = jobs(conn)
    assert {i: ended[i][:2] for i in ids} == {
        first[0]: ("done", 1),
        second[0]: ("done", 1),
        failing[0]: ("done", 2),
        lost[0]: ("done", 2),
    }
    assert [ended[i][3] for i in ids] == [0, 1, 2, 3]  # the return values its complete wrote
    totals = conn.execute("SELECT sum(done), sum(failed), sum(dead) FROM jobsup.kind_totals WHERE kind = 'k'")
    assert totals.fetchone() == (4, 2, 0)


def test_an_earlier_release_and_the_jobs_of_a_limited_kind(conn, release):
    """A kind limited to one at a time: from schema 8 on, the release's claim leaves its jobs alone and
    its claim_limited takes them one at a time, each freed by its complete or its fail; before limits,
    its claim takes the others and is refused (JS001) the moment it would take a limited job."""
    old = Old(conn, release)
    limits.set_limits(conn, "lim", "test", concurrency=1)
    free = old.enqueue("free", 0)
    held = old.claim()
    assert [j[0] for j in held] == [free]
    assert old.complete(held) == [free]
    limited = [old.enqueue("lim", n) for n in (1, 2)]
    if release.schema < 8:
        with pytest.raises(psycopg.Error) as refused:
            old.claim()
        assert refused.value.sqlstate == CLAIM_REFUSED
        assert [jobs(conn)[i][0] for i in limited] == ["queued", "queued"]
        return
    assert old.claim() == []  # its claim leaves them to claim_limited
    [one] = old.claim_limited(["lim"])
    assert one[0] == limited[0]
    assert old.claim_limited(["lim"]) == []  # one at a time
    if release.schema >= 10:  # its claim_limited returns the meta its enqueue stored
        assert one[13] == META
    assert old.fail([one]) == [one[0]]  # a failure frees the slot; its retry queues behind the other
    [other] = old.claim_limited(["lim"])
    assert other[0] == limited[1]
    assert old.complete([other]) == [limited[1]]
    [retry] = old.claim_limited(["lim"])
    assert retry[0] == limited[0] and retry[4] == 2
    assert old.complete([retry]) == [limited[0]]
    assert [jobs(conn)[i][0] for i in limited] == ["done", "done"]
