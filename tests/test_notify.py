"""The messages of the `jobsup` NOTIFY channel (jobsup/db/notify.py): every message round-trips through
encode and decode; every payload the SQL sends today (the statements and functions a supervisor of the
previous commit runs and reads too) decodes to the message it announces, and encodes back to the exact
text PostgreSQL sent; and nothing else in jobsup reads a payload."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from jobsup import client
from jobsup.db import lifecycle
from jobsup.db.lifecycle import Failure
from jobsup.db.notify import (
    CancelRequested,
    JobsQueued,
    LimitChanged,
    Message,
    QueuePaused,
    SchedulePaused,
    SlotsFreed,
    Unknown,
    decode,
    encode,
)
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.ops import control, limits, schedules

from .helpers import ROOT, notifications_before_marker, wait_for

ODD = 'a "quoted"\\ name\twith\nlines, é and \x01'

EVERY_MESSAGE: list[Message] = [
    JobsQueued(("default",), 1733370000.123456),
    JobsQueued(("a", "b", ODD), 1733370000.0),
    JobsQueued((), 1733370000.5),
    JobsQueued(("mail",)),
    CancelRequested((1, 2, 9_007_199_254_740_993), "ops@host"),
    CancelRequested(None, ODD),
    QueuePaused("mail", True),
    QueuePaused(ODD, False),
    LimitChanged("report", True, False),
    LimitChanged("report", False, True),
    SlotsFreed(("report", ODD)),
    SlotsFreed(()),
    SchedulePaused("nightly", True),
    SchedulePaused(ODD, False),
    Unknown("marker"),
    Unknown('{"something": "new"}'),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=repr)
def test_every_message_round_trips(message):
    decoded = decode(encode(message))
    assert (type(decoded), decoded) == (type(message), message)


@pytest.mark.parametrize(
    "payload",
    ["", "marker", "[1, 2]", "null", '{"queues": "default"}', '{"cancel": "all"}', '{"queue": "q"}', '{"slots": null}'],
)
def test_what_is_no_message_is_unknown(payload):
    assert decode(payload) == Unknown(payload)


def test_any_json_spelling_decodes():
    """A Python sender's json.dumps (no space before the colon, white space around) reads the same."""
    assert decode(' {"queues": ["mail"], "run_at": 12}\n') == JobsQueued(("mail",), 12)
    assert decode('{"cancel": [3, true, "x"], "by": null}') == CancelRequested((3,), "?")
    assert decode('{"limit": "k", "limited": true}') == LimitChanged("k", True, False)


def test_a_queue_named_like_a_message_is_still_an_insert():
    """The substring tests this module replaced took an insert into a queue named "schedule" for a
    schedule's pause, and the supervisors of that queue missed it until their poll."""
    for queue in ("schedule", "cancel", "paused", "limit", "slots"):
        message = decode(f'{{"queues" : ["{queue}"], "run_at" : 1733370000.000000}}')
        assert (type(message), message) == (JobsQueued, JobsQueued((queue,), 1733370000.0))


# --- the payloads the SQL sends ------------------------------------------------------------------


@pytest.fixture
def heard(dsn: str, conn: psycopg.Connection) -> Iterator:
    """What the SQL announced since the last call: [(payload, message)], each payload checked to
    encode back to itself."""
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(SQL["listen"])

        def heard() -> list[Message]:
            payloads = [note.payload for note in notifications_before_marker(listener, conn)]
            messages = [decode(p) for p in payloads]
            assert [encode(m) for m in messages] == payloads
            return messages

        yield heard


def epoch(conn: psycopg.Connection, job_id: int | None) -> float:
    """A job's run_at as the SQL writes it in a payload, read back as a float."""
    row = conn.execute("SELECT extract(epoch FROM run_at)::float8 FROM jobsup.jobs WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return row[0]


def one(messages: list[Message], kind: type) -> Message:
    [message] = messages
    assert type(message) is kind, message
    return message


# Each statement and function that sends on the channel, with the test below that makes it send.
COVERED = {
    "notify_inserted": "test_an_insert_announces_its_queues_and_earliest_run_at",
    "settle_children": "test_a_parent_s_end_announces_the_children_it_queues",
    "release": "test_a_job_back_in_its_queue_announces_it_due_now",
    "release_orphans": "test_a_job_back_in_its_queue_announces_it_due_now",
    "reap": "test_a_job_back_in_its_queue_announces_it_due_now",
    "retry_now": "test_a_job_back_in_its_queue_announces_it_due_now",
    "requeue_dead": "test_a_job_back_in_its_queue_announces_it_due_now",
    "cancel_jobs": "test_a_cancel_of_running_jobs_names_them_up_to_500",
    "queue_pause": "test_pause_and_resume_of_a_queue",
    "queue_resume": "test_pause_and_resume_of_a_queue",
    "limit_notify": "test_a_limit_set_and_removed",
    "limit_slots_freed": "test_slots_freed",
    "schedule_pause": "test_pause_and_resume_of_a_schedule",
}


def test_every_sender_is_covered_here_and_documented(conn):
    """A new statement or function that sends on the channel fails this until a test below makes it
    send and the module's docstring and the architecture page name it."""
    statements = {name for name, text in SQL.items() if "pg_notify" in text}
    functions = {
        row[0]
        for row in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'jobsup'::regnamespace AND prosrc LIKE '%pg_notify%'"
        )
    }
    assert statements | functions == set(COVERED)
    assert set(COVERED.values()) <= set(globals())
    module = (ROOT / "jobsup" / "db" / "notify.py").read_text()
    architecture = (ROOT / "docs" / "design" / "architecture.md").read_text()
    for name in COVERED:
        named = re.compile(rf"[`.]{name}\b")
        assert named.search(module) and named.search(architecture), name


def test_an_insert_announces_its_queues_and_earliest_run_at(conn, heard):
    job = client.enqueue(conn, "k", queue="mail")
    assert heard() == [JobsQueued(("mail",), epoch(conn, job))]
    later = client.enqueue(conn, "k", queue="mail", delay=3600)
    assert heard() == [JobsQueued(("mail",), epoch(conn, later))]
    ids = client.enqueue_many(conn, [{"kind": "k", "queue": q, "delay": d} for q, d in (("b", 60), ("a", 5))])
    assert heard() == [JobsQueued(("a", "b"), epoch(conn, ids[1]))]
    many = client.enqueue_many(conn, [{"kind": "k", "queue": f"q{n}"} for n in range(21)])
    assert one(heard(), JobsQueued) == JobsQueued((), min(epoch(conn, i) for i in many))
    client.enqueue(conn, "k", queue=ODD.replace("\x01", ""))
    assert one(heard(), JobsQueued).queues == (ODD.replace("\x01", ""),)


def test_a_parent_s_end_announces_the_children_it_queues(conn, heard):
    parent = client.enqueue(conn, "step", queue="flow")
    child = client.enqueue(conn, "step", queue="later", after=[parent])
    heard()
    [job] = lifecycle.claim(conn, ["flow"], 1, "sup-a", 30)
    lifecycle.complete(conn, [(job.id, job.attempts)], "sup-a")
    assert heard() == [JobsQueued(("later",), epoch(conn, child))]


def test_a_job_back_in_its_queue_announces_it_due_now(conn, heard):
    client.enqueue_many(conn, [{"kind": "k", "queue": "back", "max_attempts": 1} for _ in range(4)])
    client.enqueue(conn, "k", queue="retried", max_attempts=2)
    heard()
    due_now = [JobsQueued(("back",))]
    a, b, c, d = lifecycle.claim(conn, ["back"], 4, "sup-a", 30)
    assert lifecycle.release(conn, [(a.id, a.attempts)], "sup-a") == [a.id]
    assert heard() == due_now
    assert lifecycle.release_orphans(conn, "sup-a", [c.id, d.id]) == [b.id]
    assert heard() == due_now
    conn.execute("UPDATE jobsup.jobs SET locked_until = now() - interval '1 second' WHERE id = %s", [c.id])
    assert [o.id for o in lifecycle.reap(conn, "sup-b")] == [c.id]
    assert heard() == due_now
    lifecycle.fail(conn, [Failure(d.id, d.attempts, "boom")], "sup-a")
    assert heard() == []  # dead: nothing to claim
    assert control.requeue_dead(conn, ids=[d.id]) == [d.id]
    assert heard() == due_now
    [r] = lifecycle.claim(conn, ["retried"], 1, "sup-a", 30)
    lifecycle.fail(conn, [Failure(r.id, r.attempts, "boom", delay=3600)], "sup-a")
    heard()
    control.retry(conn, [r.id])
    assert heard() == [JobsQueued(("retried",))]


def test_a_cancel_of_running_jobs_names_them_up_to_500(conn, heard):
    client.enqueue_many(conn, [{"kind": "k"} for _ in range(503)])
    client.enqueue(conn, "k")  # queued: cancelled at once, announced to no one
    heard()
    running = lifecycle.claim(conn, ["default"], 2, "sup-a", 30)
    control.cancel(conn, ids=[j.id for j in running], by=ODD)
    message = one(heard(), CancelRequested)
    assert (sorted(message.ids or ()), message.by) == (sorted(j.id for j in running), ODD)
    lifecycle.claim(conn, ["default"], 501, "sup-a", 30)
    control.cancel(conn, kind="k", by="ops")
    assert heard() == [CancelRequested(None, "ops")]


def test_pause_and_resume_of_a_queue(conn, heard):
    assert control.pause(conn, "mail", by="ops")
    assert heard() == [QueuePaused("mail", True)]
    assert control.resume(conn, "mail")
    assert heard() == [QueuePaused("mail", False)]


def test_a_limit_set_and_removed(conn, heard):
    limits.set_limits(conn, "report", "ops", concurrency=2)
    assert heard() == [LimitChanged("report", True, False)]
    limits.set_limits(conn, "report", "ops", key_concurrency=1)
    assert heard() == [LimitChanged("report", True, True)]
    limits.set_limits(conn, "report", "ops", concurrency=None, key_concurrency=None)
    assert heard() == [LimitChanged("report", False, False)]


def test_slots_freed(conn, heard):
    conn.execute(SQL["limit_slots_freed"], {"kinds": ["report", "mail"]})
    assert heard() == [SlotsFreed(("report", "mail"))]


def test_pause_and_resume_of_a_schedule(conn, heard):
    conn.execute(
        SQL["schedule_declare"],
        {
            "name": "nightly",
            "kind": "k",
            "expression": "0 3 * * *",
            "tz": "UTC",
            "payload": Jsonb({}),
            "queue": "default",
            "priority": 0,
            "max_attempts": 3,
            "missed": "latest",
        },
    )
    assert schedules.set_paused(conn, "nightly", True)
    assert heard() == [SchedulePaused("nightly", True)]
    assert schedules.set_paused(conn, "nightly", False)
    assert heard() == [SchedulePaused("nightly", False)]


# --- nothing else reads a payload ----------------------------------------------------------------

# The keys of the channel's messages quoted as JSON inside a Python string ('"schedule"'), the old
# substring tests' way of telling messages apart.
_KEYS = ("queues", "run_at", "cancel", "by", "queue", "paused", "limit", "limited", "keyed", "slots", "schedule")
_QUOTED_KEY = re.compile(r"""['"]\\?"(""" + "|".join(_KEYS) + r""")\\?"['"]""")
# In a module that hears notifications: a payload read other than by decode, or any JSON parse.
_RAW_READ = re.compile(r"json\.loads\(|(?<!decode\()\b\w+\.payload\b")


def offences(where: str, text: str) -> list[str]:
    found = [f"{where}: {m.group(0)}" for m in _QUOTED_KEY.finditer(text)]
    if ".notifies(" in text:
        if "notify.decode(" not in text:
            found.append(f"{where}: hears notifications without notify.decode")
        found += [f"{where}: {m.group(0)}" for m in _RAW_READ.finditer(text)]
    return found


def test_no_payload_is_read_outside_the_one_module():
    """Every module that hears notifications decodes them with jobsup.db.notify and routes by type: no
    JSON parse of a payload, no substring test for a message's key, anywhere else in jobsup."""
    found = []
    for path in sorted((ROOT / "jobsup").rglob("*.py")):
        if path != ROOT / "jobsup" / "db" / "notify.py":
            found += offences(str(path.relative_to(ROOT)), path.read_text())
    assert found == []


def test_the_check_sees_the_old_way():
    """The check above finds what the listener, the dispatcher and the scheduler did before."""
    listener = """async for note in conn.notifies():
    if not d.control(note.payload):
        d.notified(note.payload)"""
    assert len(offences("listener", listener)) == 3
    assert offences("scheduler", "if '\"schedule\"' not in payload:") != []
    assert offences("dispatcher", "_CONTROL_WORDS = ('\"cancel\"', '\"paused\"', '\"limit\"', '\"slots\"')") != []
    decoded = "async for note in conn.notifies():\n    match message := notify.decode(note.payload):"
    assert offences("listener", decoded) == []


def test_run_at_keeps_six_decimals():
    assert encode(JobsQueued(("q",), 1733370000.1)) == '{"queues" : ["q"], "run_at" : 1733370000.100000}'
    assert decode(encode(JobsQueued(("q",), 1733370000.1))) == JobsQueued(("q",), 1733370000.1)


# --- the listener routes by type -----------------------------------------------------------------


@pytest.mark.parametrize("queue", ["default", "schedule"])
def test_a_delayed_insert_wakes_its_supervisor_on_time_whatever_its_queue_s_name(conn, dsn, start, queue):
    """The delayed job's NOTIFY alone tells the supervisor when to claim it (the poll is 30 s): the
    substring tests took an insert into a queue named "schedule" for a schedule's pause, and its job
    waited for the poll."""
    sup = start("--poll-interval", "30s", "--queues", queue, procs=1)
    sup.wait_ready()

    def listening() -> bool:
        # The listener's connection has listened and read the delayed jobs it knows of: from now on
        # only a NOTIFY tells the supervisor of a new one.
        row = conn.execute(
            "SELECT query FROM pg_stat_activity WHERE application_name = 'jobsup listen' AND state = 'idle'"
        ).fetchone()
        return row is not None and "WITH RECURSIVE levels" in row[0]  # the statement `upcoming`

    wait_for(listening, message="the listener listening, the delayed jobs read")
    job = client.enqueue(conn, "ok", queue=queue, delay=1)
    started = wait_for(
        lambda: conn.execute("SELECT started_at - run_at FROM jobsup.jobs WHERE id = %s", [job]).fetchone()[0],
        timeout=20,
        message="the delayed job started",
    )
    assert started.total_seconds() < 10, started  # the poll would start it 30 s after the enqueue
