"""Operators' verbs on jobs and queues: cancel, pause, resume, retry, requeue-dead. The commands and
the console call these; each is one statement of `db/queries/control.sql`, announced on the jobsup channel where the
supervisors must act (a running job's cancel, a pause), with the supervisors' poll as the backstop."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import Op, arun, run, sorted_ids
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
    it), retried, or unchanged; `status` is the job's status after the command."""

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


def _cancel_params(ids: Sequence[int] | None, kind: str | None, queue: str | None, by: str | None) -> dict[str, Any]:
    if (ids is None) == (kind is None):
        raise BadInput("cancel needs either --id N ... or --kind K (one of them)")
    if queue is not None and kind is None:
        raise BadInput("--queue narrows --kind; with --id the ids say which jobs")
    return {
        "ids": list(ids) if ids is not None else None,
        "kind": _name(kind, "--kind"),
        "queue": _name(queue, "--queue"),
        "by": by or operator(),
    }


def _cancel_actions(before: dict[int, tuple], changed: list[tuple]) -> list[JobAction]:
    actions = []
    for job_id, job_kind, _queue, status, locked_by, _told in changed:
        if status == "cancelled":  # only a queued job is cancelled by the statement itself
            actions.append(JobAction(job_id, job_kind, "cancelled", "cancelled", "queued"))
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
    return sorted(actions, key=lambda a: a.id)


def cancel(
    conn: psycopg.Connection,
    *,
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    by: str | None = None,
) -> list[JobAction]:
    """Cancel jobs by id, or every queued and running job of `kind` (in `queue`). Queued (and
    scheduled) jobs become `cancelled` at once; a running job's supervisor is told to stop it (it then
    records `cancelled`); finished jobs are reported and left as they are. An unknown id is BadInput,
    with nothing changed."""
    params = _cancel_params(ids, kind, queue, by)
    with conn.transaction():
        before = _missing(ids, conn.execute(SQL["jobs_status"], {"ids": list(ids)}).fetchall()) if ids else {}
        changed = conn.execute(SQL["cancel_jobs"], params).fetchall()
    return _cancel_actions(before, changed)


async def acancel(
    conn: psycopg.AsyncConnection,
    *,
    ids: Sequence[int] | None = None,
    kind: str | None = None,
    queue: str | None = None,
    by: str | None = None,
) -> list[JobAction]:
    params = _cancel_params(ids, kind, queue, by)
    async with conn.transaction():
        before = {}
        if ids:
            cur = await conn.execute(SQL["jobs_status"], {"ids": list(ids)})
            before = _missing(ids, await cur.fetchall())
        changed = await (await conn.execute(SQL["cancel_jobs"], params)).fetchall()
    return _cancel_actions(before, changed)


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
