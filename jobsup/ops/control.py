"""Operators' verbs on jobs and queues: cancel, pause, resume, retry, requeue-dead. The commands and
the console call these; each is one statement of `db/queries/control.sql`, announced on the jobsup channel where the
supervisors must act (a running job's cancel, a pause), with the supervisors' poll as the backstop."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import Op, arun, arun_steps, run, run_steps, sorted_ids
from jobsup.errors import BadInput

FINISHED = ("done", "dead", "cancelled")


def operator() -> str:
    """Who an operator's command says did it: `user@host`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "?"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class JobAction:
    """What a command did to one job. `action`: cancelled, requested (running: its supervisor stops
    it), retried, or unchanged; after a cancel, the jobs that waited for a job it cancelled are
    cascaded (cancelled with it) or released (queued: on_parent_failure "run"). `status` is the job's
    status after the command."""

    id: int
    kind: str
    action: str
    status: str
    was: str
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _missing(ids: Sequence[int], rows: list[tuple]) -> dict[int, tuple]:
    """The rows of `jobs_status` by id; BadInput naming the ids that do not exist."""
    found = {row[0]: row for row in rows}
    missing = [i for i in dict.fromkeys(ids) if i not in found]
    if missing:
        raise BadInput(f"no job with id {', '.join(map(str, missing))}; nothing was changed")
    return found


def _name(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"{what} cannot be empty")
    return value


def _cancel_params(
    ids: Sequence[int] | None, kind: str | None, queue: str | None, workflow: int | None, by: str | None
) -> dict[str, Any]:
    if sum(given is not None for given in (ids, kind, workflow)) != 1:
        raise BadInput("cancel needs one of --id N ..., --kind K or --workflow ID")
    if queue is not None and kind is None:
        says = "the ids say" if workflow is None else "the workflow says"
        raise BadInput(f"--queue narrows --kind; with --{'id' if workflow is None else 'workflow'} {says} which jobs")
    if workflow is not None and (isinstance(workflow, bool) or not isinstance(workflow, int) or workflow < 1):
        raise BadInput(f"--workflow takes a workflow's id, a whole number from 1, not {workflow!r}")
    return {
        "ids": list(ids) if ids is not None else None,
        "kind": _name(kind, "--kind"),
        "queue": _name(queue, "--queue"),
        "workflow": workflow,
        "by": by or operator(),
    }


def _cancel_actions(before: dict[int, tuple], changed: list[tuple], followed: list[tuple]) -> list[JobAction]:
    actions = []
    for job_id, job_kind, _queue, status, locked_by, was_waiting, _told in changed:
        if status == "cancelled":  # only a waiting or queued job is cancelled by the statement itself
            actions.append(
                JobAction(job_id, job_kind, "cancelled", "cancelled", "waiting" if was_waiting else "queued")
            )
        else:
            actions.append(
                JobAction(
                    job_id,
                    job_kind,
                    "requested",
                    status,
                    status,
                    f"running under {locked_by}: its supervisor stops the worker",
                )
            )
    done = {row[0] for row in changed}
    for job_id, (_, job_kind, status, _attempts, _waiting, _locked_by, cancelled_by) in before.items():
        if job_id not in done:
            note = f"cancel requested already by {cancelled_by}" if status == "running" else f"{status} already"
            actions.append(JobAction(job_id, job_kind, "unchanged", status, status, note))
    # What the cancel did to the jobs that wait for these comes after them: the console takes the first
    # action of a cancel by one id as that job's.
    after = [
        JobAction(job_id, kind, action, status, "waiting", note) for job_id, kind, action, status, note in followed
    ]
    return sorted(actions, key=lambda a: a.id) + after


def _cancel_steps(
    ids: Sequence[int] | None, kind: str | None, queue: str | None, workflow: int | None, by: str | None
) -> Generator[Op, Any, list[JobAction]]:
    """The statements of a cancel, each sent the answer of the one before (run by cancel and acancel)."""
    params = _cancel_params(ids, kind, queue, workflow, by)
    before: dict[int, tuple] = {}
    if ids:
        rows = yield Op("jobs_status", {"ids": list(ids)}, list)
        before = _missing(ids, rows)
    if workflow is not None:
        found = yield Op("workflow_row", {"id": workflow}, list)
        if not found:
            raise BadInput(f"no workflow {workflow}; nothing was changed")
    changed = yield Op("cancel_jobs", params, list)
    gone = [row[0] for row in changed if row[3] == "cancelled"]
    followed = (yield Op("cancel_followed", {"ids": gone}, list)) if gone else []
    return _cancel_actions(before, changed, followed)


def cancel(
    conn: psycopg.Connection,
    *,
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    workflow: int | None = None,
    by: str | None = None,
) -> list[JobAction]:
    """Cancel jobs by id, every waiting, queued and running job of `kind` (in `queue`), or every one of
    `workflow`. Waiting and queued (and scheduled) jobs become `cancelled` at once; a running job's
    supervisor is told to stop it (it then records `cancelled`); finished jobs are reported (by id)
    and left as they are. The jobs that waited for a job cancelled here follow, after those: each
    `cascaded` (cancelled with it, under on_parent_failure "cancel") or `released` (queued, under
    "run"). An unknown id or workflow is BadInput, with nothing changed."""
    steps = _cancel_steps(ids, kind, queue, workflow, by)
    with conn.transaction():
        return run_steps(conn, steps)


async def acancel(
    conn: psycopg.AsyncConnection,
    *,
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    workflow: int | None = None,
    by: str | None = None,
) -> list[JobAction]:
    steps = _cancel_steps(ids, kind, queue, workflow, by)
    async with conn.transaction():
        return await arun_steps(conn, steps)


def retry(conn: psycopg.Connection, ids: Sequence[int]) -> list[JobAction]:
    """Jobs waiting for their backoff (queued, run_at in the future, attempted before) are due now;
    the others are reported as they are. An unknown id is BadInput, with nothing changed."""
    with conn.transaction():
        before = _missing(ids, conn.execute(SQL["jobs_status"], {"ids": list(ids)}).fetchall())
        moved = {row[0] for row in conn.execute(SQL["retry_now"], {"ids": list(ids)}).fetchall()}
    actions = []
    for job_id, (_, kind, status, attempts, waiting, _locked_by, _by) in sorted(before.items()):
        if job_id in moved:
            actions.append(JobAction(job_id, kind, "retried", "queued", "queued", f"attempt {attempts + 1} is due now"))
        elif status == "queued" and waiting:
            note = "scheduled, not waiting for a retry (it never ran)"
            actions.append(JobAction(job_id, kind, "unchanged", status, status, note))
        elif status == "queued":
            actions.append(JobAction(job_id, kind, "unchanged", status, status, "due already"))
        else:
            actions.append(JobAction(job_id, kind, "unchanged", status, status, f"{status}, not waiting for a retry"))
    return actions


def _pause_op(queue: str, pausing: bool, by: str | None) -> tuple[str, dict[str, Any]]:
    queue = _name(queue, "a queue name")  # type: ignore[assignment]
    if pausing:
        return "queue_pause", {"queue": queue, "by": by or operator()}
    return "queue_resume", {"queue": queue}


def pause(conn: psycopg.Connection, queue: str, by: str | None = None) -> bool:
    """Stop every supervisor claiming from `queue` (running jobs finish); False if it was paused."""
    name, params = _pause_op(queue, True, by)
    return bool(conn.execute(SQL[name], params).fetchall())


def resume(conn: psycopg.Connection, queue: str) -> bool:
    """Let the supervisors claim from `queue` again; False if it was not paused."""
    name, params = _pause_op(queue, False, None)
    return bool(conn.execute(SQL[name], params).fetchall())


async def aset_paused(conn: psycopg.AsyncConnection, queue: str, paused: bool, by: str | None = None) -> bool:
    """pause (`paused`) or resume, on an async connection; whether it changed anything."""
    name, params = _pause_op(queue, paused, by)
    return bool(await (await conn.execute(SQL[name], params)).fetchall())


def paused_queues(conn: psycopg.Connection) -> list[str]:
    return [row[0] for row in conn.execute(SQL["queue_pauses"]).fetchall()]


def _requeue_op(ids: Sequence[int] | None, kind: str | None, error: str | None) -> Op:
    return Op("requeue_dead", {"ids": list(ids) if ids is not None else None, "kind": kind, "error": error}, sorted_ids)


def requeue_dead(
    conn: psycopg.Connection, *, ids: Sequence[int] | None = None, kind: str | None = None, error: str | None = None
) -> list[int]:
    """Queue dead jobs again (all, or those matching ids, kind and last error), attempts reset."""
    return run(conn, _requeue_op(ids, kind, error))


async def arequeue_dead(
    conn: psycopg.AsyncConnection,
    *,
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    error: str | None = None,
) -> list[int]:
    return await arun(conn, _requeue_op(ids, kind, error))
