"""Every message on the pipes between the supervisor and a worker, built and read here alone.

On the wire a message is a plain tuple, its tag first (wire.py pickles it): a tuple pickles and unpickles
faster than any class would, a NamedTuple's included, and a job's hand-out and its answer cross the pipes
thousands of times a second. So each message has one function that builds its tuple and one that reads
it back (a NamedTuple where it has several fields), and its tag is one of the constants below; nothing
else indexes a message or spells a tag.

The supervisor (jobsup/supervisor/keeper.py, and jobsup.testing.drain) sends:

- JOBS: alone jobs, each in its wire form (job_fields), which the worker runs one after the other;
- SHARED: jobs that share the process (sharing.py), run all at once;
- CANCEL: stop one shared job (Cancel);
- INTERRUPT: why the SIGTERM that follows it stops the running attempt (Interrupt), for its run middleware;
- STOP: exit once idle.

A worker (main.py, sharing.py) sends:

- READY: what its app handles (Ready), once the app is imported and its start functions ran;
- FATAL: why it cannot start, before it exits;
- ANSWER: how a job's attempt ended, with how long the handler ran and the attempt's trace if traced;
- RECALLED: the ids of the jobs handed to it that it gives back unstarted;
- LAG, BLOCKED, UNBLOCKED: how its event loop fares while it runs shared jobs (Blocked).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from jobsup.db.json_text import loads
from jobsup.job import Claimed, Job
from jobsup.outcomes import Answer

Message = tuple[Any, ...]

JOBS = "jobs"
SHARED = "shared"
CANCEL = "cancel"
INTERRUPT = "interrupt"
STOP = "stop"
READY = "ready"
FATAL = "fatal"
ANSWER = "answer"
RECALLED = "recalled"
LAG = "lag"
BLOCKED = "blocked"
UNBLOCKED = "unblocked"

# Not a message of the pipes: what sharing.Shared.serve returns when its last job has ended and no
# message for the worker's own loop came meanwhile.
IDLE: Message = ("idle",)

# --- a job's wire form ---------------------------------------------------------------------------

# What the supervisor sends of a job: the fields of Job a handler sees, in job_fields' order, its payload,
# errors and meta as JSON text (id, kind, payload, queue, attempts, max_attempts, priority, snoozes,
# errors, key, meta).
JobFields = tuple[int, str, str, str, int, int, int, int, str | None, str | None, str | None]


def job_fields(job: Claimed) -> JobFields:
    """What the supervisor sends a worker of each job: the fields of Job a handler sees, its payload,
    errors and meta as the JSON text the claim returned them as (the worker parses them)."""
    return (
        job.id,
        job.kind,
        job.payload,
        job.queue,
        job.attempts,
        job.max_attempts,
        job.priority,
        job.snoozes,
        job.errors,
        job.key,
        job.meta,
    )


# Payloads, errors and meta come as the JSON text of jsonb columns, read by the C scanner alone.
column_json = loads
_make_job = Job._make


def job_of(fields: JobFields) -> Job:
    """The Job a handler sees, from what job_fields() sent of it: its JSON texts read, in Job's order
    (built from a tuple, in a third of the time keywords take)."""
    job_id, kind, payload, queue, attempts, max_attempts, priority, snoozes, errors, key, meta = fields
    return _make_job(
        (
            job_id,
            kind,
            None if payload is None else column_json(payload),
            queue,
            attempts,
            max_attempts,
            priority,
            None,  # run_at, created_at: not sent
            None,
            snoozes,
            column_json(errors) if errors else [],
            None,  # started_at
            key,
            None if meta is None else column_json(meta),
        )
    )


# --- the supervisor's -----------------------------------------------------------------------------


def jobs(claimed: Iterable[Claimed]) -> Message:
    """Alone jobs for an idle worker, which runs them in this order."""
    return (JOBS, [job_fields(job) for job in claimed])


def shared(claimed: Iterable[Claimed]) -> Message:
    """Jobs that share the process, started all at once (within the room it has)."""
    return (SHARED, [job_fields(job) for job in claimed])


def read_jobs(message: Message) -> list[JobFields]:
    """The jobs of a JOBS or SHARED message, in their wire form (job_of makes each a Job)."""
    return message[1]


class Cancel(NamedTuple):
    job_id: int
    status: str  # what its run middleware are told (jobsup.middleware.RunOutcome's)
    reason: str


def cancel(stop: Cancel) -> Message:
    return (CANCEL, *stop)


def read_cancel(message: Message) -> Cancel:
    return Cancel._make(message[1:])


class Interrupt(NamedTuple):
    status: str  # what the running attempt's run middleware are told (RunOutcome's)
    reason: str


def interrupt(why: Interrupt) -> Message:
    return (INTERRUPT, *why)


def read_interrupt(message: Message) -> Interrupt:
    return Interrupt._make(message[1:])


_STOP: Message = (STOP,)


def stop() -> Message:
    return _STOP


# --- the worker's ---------------------------------------------------------------------------------


class Ready(NamedTuple):
    """What a worker tells once its app is imported."""

    pid: int
    kinds: list[str] | None  # the kinds it handles, sorted; None: any (an app that finds them by name)
    timeouts: dict[str, float]  # kind -> its handler's timeout, where it sets one
    schedules: list[Any]  # the app's Schedules
    limits: dict[str, dict[str, Any]]  # kind -> the limits its handler declares, as JSON
    shared: dict[str, int]  # the kinds whose jobs share a process -> the most in one (0: its capacity)


def ready(info: Ready) -> Message:
    return (READY, *info)


def read_ready(message: Message) -> Ready:
    return Ready._make(message[1:])


def fatal(reason: str) -> Message:
    return (FATAL, reason)


def read_fatal(message: Message) -> str:
    return message[1]


def answer(outcome: Answer, ran: float, trace: tuple[str, str] | None = None) -> Message:
    """How a job's attempt ended: ("answer", *the Answer's fields but its run time, `ran`[, trace]): the
    seconds the handler ran, measured in the worker, and the (trace id, span id) of a traced attempt."""
    if trace is None:
        return (ANSWER, *outcome[:-1], ran)
    return (ANSWER, *outcome[:-1], ran, trace)


def read_answer(message: Message) -> tuple[Answer, tuple[str, str] | None]:
    """The Answer (its run time the worker's) and the attempt's trace, None when it was not traced."""
    return Answer._make(message[1:7]), message[7] if len(message) > 7 else None


def recalled(ids: list[int]) -> Message:
    return (RECALLED, ids)


def read_recalled(message: Message) -> list[int]:
    return message[1]


def lag(seconds: float) -> Message:
    """How late the worker's event loop came round at worst in the last second."""
    return (LAG, seconds)


def read_lag(message: Message) -> float:
    return message[1]


class Blocked(NamedTuple):
    """The worker's event loop has not come round for `behind` seconds while it runs `jobs`; `culprit`:
    the job a sample of its stack found blocking it, if any."""

    behind: float
    jobs: list[int]
    culprit: int | None


def blocked(report: Blocked) -> Message:
    return (BLOCKED, *report)


def read_blocked(message: Message) -> Blocked:
    return Blocked._make(message[1:])


_UNBLOCKED: Message = (UNBLOCKED,)


def unblocked() -> Message:
    """The worker's event loop came round again after a BLOCKED."""
    return _UNBLOCKED
