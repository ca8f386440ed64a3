"""Every message on the pipes between the supervisor and a worker comes back as it was built, through the
real framing: a field dropped, added or moved in a builder or its reader fails here, not in a worker."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from jobsup.job import Claimed, Job
from jobsup.outcomes import Answer
from jobsup.schedule import Schedule
from jobsup.worker import messages
from jobsup.worker.wire import Reader, send


@pytest.fixture
def pipe():
    """(send, receive) over a real pipe: what one end writes with wire.send, the other reads whole."""
    read_fd, write_fd = os.pipe()
    reader = Reader(read_fd)

    def through(message: messages.Message) -> messages.Message:
        send(write_fd, message)
        got = reader.read_one()
        assert got is not None
        return got

    yield through
    os.close(read_fd)
    os.close(write_fd)


NOW = datetime(2026, 12, 5, 6, 30, tzinfo=UTC)
# A claimed job with every field a value of its own, its JSON columns as text, as the claims link gives them.
CLAIMED = Claimed(
    7, "email", '{"to": "a@example.com"}', "mail", 2, 5, -3, NOW, NOW, 4, '[{"attempt": 1}]', NOW, "acct", '{"t": "x"}'
)
HANDLERS_JOB = Job(
    id=7,
    kind="email",
    payload={"to": "a@example.com"},
    queue="mail",
    attempts=2,
    max_attempts=5,
    priority=-3,
    snoozes=4,
    errors=[{"attempt": 1}],
    key="acct",
    meta={"t": "x"},
)

# Each message with fields, built from a value, and what reads that value back (NamedTuples: each field a
# value of its own, so a field moved or dropped cannot compare equal).
ROUND_TRIPS = {
    messages.CANCEL: (messages.cancel, messages.read_cancel, messages.Cancel(12, "timed_out", "timed out after 3s")),
    messages.INTERRUPT: (
        messages.interrupt,
        messages.read_interrupt,
        messages.Interrupt("cancelled", "cancelled by al"),
    ),
    messages.READY: (
        messages.ready,
        messages.read_ready,
        messages.Ready(
            4321,
            ["email", "sms"],
            {"email": 30.0},
            [Schedule("nightly", "sms", "@daily")],
            {"sms": {"concurrency": 2}},
            {"email": 0},
        ),
    ),
    messages.FATAL: (messages.fatal, messages.read_fatal, "importing lab:app failed: ImportError"),
    messages.RECALLED: (messages.recalled, messages.read_recalled, [8, 9, 10]),
    messages.LAG: (messages.lag, messages.read_lag, 0.0125),
    messages.BLOCKED: (messages.blocked, messages.read_blocked, messages.Blocked(1.25, [3, 5], 5)),
}


def tag_names() -> dict[str, str]:
    """Every tag messages.py defines, by its constant's name."""
    return {
        name: value
        for name, value in vars(messages).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }


@pytest.mark.parametrize("tag", sorted(ROUND_TRIPS))
def test_a_message_reads_back_what_it_was_built_from(pipe, tag):
    build, read, value = ROUND_TRIPS[tag]
    got = pipe(build(value))
    assert got[0] == tag
    assert read(got) == value
    if isinstance(value, tuple):  # every field on the wire, after the tag, in order
        assert got[1:] == tuple(value)


@pytest.mark.parametrize("build, tag", [(messages.jobs, messages.JOBS), (messages.shared, messages.SHARED)])
def test_the_jobs_of_a_hand_out_come_back_as_the_handler_sees_them(pipe, build, tag):
    other = CLAIMED._replace(id=8, payload="{}", errors=None, key=None, meta=None)
    got = pipe(build([CLAIMED, other]))
    assert got[0] == tag
    assert [messages.job_of(fields) for fields in messages.read_jobs(got)] == [
        HANDLERS_JOB,
        HANDLERS_JOB._replace(id=8, payload={}, errors=[], key=None, meta=None),
    ]


@pytest.mark.parametrize("trace", [None, ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")])
def test_an_answer_reads_back_with_the_run_time_the_worker_measured_and_its_trace(pipe, trace):
    answer = Answer(7, "RetryAfter: 429", "Traceback ...", '{"sent": 1}', ("retry", 60.0), 0.0)
    got = pipe(messages.answer(answer, 0.75, trace))
    # The cheap form the hot path sends: the Answer's fields but its run time, then the run time and trace.
    assert got == (messages.ANSWER, 7, "RetryAfter: 429", "Traceback ...", '{"sent": 1}', ("retry", 60.0), 0.75) + (
        (trace,) if trace else ()
    )
    assert messages.read_answer(got) == (answer._replace(ran=0.75), trace)


def test_the_messages_without_fields(pipe):
    assert pipe(messages.stop()) == (messages.STOP,)
    assert pipe(messages.unblocked()) == (messages.UNBLOCKED,)


def test_every_tag_is_one_message_and_is_checked_here():
    builders = {
        messages.JOBS,
        messages.SHARED,
        messages.ANSWER,
        messages.STOP,
        messages.UNBLOCKED,
        *ROUND_TRIPS,
    }
    tags = set(tag_names().values())
    assert tags == builders
    assert len(tags) == len(tag_names())  # no two messages share a tag
    assert messages.IDLE[0] not in tags  # Shared.serve's own word, never sent: no message may take it
