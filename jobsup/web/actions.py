"""The actions, each a POST through jobsup.ops.control (or cron, or limits) as the terminal console
acts, checked by `access.guard` (CSRF token, operator's role) before anything changes, and recorded in
the audit in the action's own transaction. Each answers with a redirect (the page it came from, with a
notice saying what it did), so a reload does not repeat it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import psycopg
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from jobsup.errors import BadInput, DatabaseUnavailable, JobsupError
from jobsup.ops import audit
from jobsup.ops import limits as kind_limits
from jobsup.ops import schedules as schedule_ops
from jobsup.ops.control import acancel, arequeue_dead, aset_paused
from jobsup.ops.snapshot import arows
from jobsup.web.access import Refused, guard
from jobsup.web.job_views import parse_id
from jobsup.web.layout import Identity, href, identity, message
from jobsup.web.sessions import SESSION_COOKIE

Done = tuple[str, str, list[int], str]  # (action, target, job ids, what it did in words)
LIMIT_FIELDS = ("concurrency", "rate", "key_concurrency", "key_rate")


def _back(request: Request, form: dict[str, str], notice: str) -> Response:
    """Back to the page the form was on (a page of this app only), with `notice`."""
    root = href(request, "/")
    back = form.get("back", "")
    if back.endswith("/dead/confirm"):
        back = href(request, "/dead")
    if not back.startswith(root) or back.startswith(href(request, "/actions")) or "//" in back:
        back = root
    return RedirectResponse(f"{back}?{urlencode({'notice': notice})}", status_code=303)


def _not_done(request: Request, exc: JobsupError) -> Response:
    """The page of an action that changed nothing: bad input 400, no database 503, else 500."""
    if isinstance(exc, BadInput):
        return message(request, "Not done", str(exc), 400)
    if isinstance(exc, DatabaseUnavailable):
        return message(request, "Not done", f"the database cannot be reached: {exc}", 503)
    return message(request, "Not done", str(exc), 500)


async def _checked(request: Request) -> tuple[dict[str, str], Identity] | Response:
    """The form and the operator of a POST that `guard` let through, or the page refusing it."""
    try:
        form = await guard(request)
    except Refused as refused:
        return message(request, "Refused", refused.reason, refused.status)
    who = identity(request)
    assert who is not None
    return form, who


async def _act(
    request: Request, work: Callable[[dict[str, str], psycopg.AsyncConnection], Awaitable[Done]]
) -> Response:
    checked = await _checked(request)
    if isinstance(checked, Response):
        return checked
    form, who = checked

    async def in_transaction(conn: psycopg.AsyncConnection) -> str:
        async with conn.transaction():
            action, target, ids, said = await work(form, conn)
            await audit.arecord(
                conn, who=who.user, role=who.role, action=action, target=target, job_ids=ids, detail=said
            )
        return said

    try:
        said = await request.app.state.db.run(in_transaction)
    except JobsupError as exc:
        return _not_done(request, exc)
    request.app.state.boards.board = None  # the next page reads the change, not the board before it
    return _back(request, form, said)


def _ids(form: dict[str, str]) -> list[int]:
    text = form.get("ids", "")
    ids = [parse_id(part.strip(), "job") for part in text.split(",") if part.strip()]
    if not ids:
        raise BadInput("which jobs? (ids)")
    return ids


def _one(form: dict[str, str], name: str) -> str:
    value = form.get(name, "").strip()
    if not value:
        raise BadInput(f"which {name}?")
    return value


async def requeue(request: Request) -> Response:
    async def work(form: dict[str, str], conn: psycopg.AsyncConnection) -> Done:
        ids = _ids(form)
        kind = form.get("kind") or None
        done = await arequeue_dead(conn, ids=ids, kind=kind)
        asked = f"{len(ids):,} dead job{'s' if len(ids) != 1 else ''}" + (f" of kind {kind}" if kind else "")
        target = f"kind {kind}" if kind else ", ".join(f"job {i}" for i in ids[:5])
        return "requeue", target, done, f"requeued {len(done):,} of {asked}"

    return await _act(request, work)


async def cancel(request: Request) -> Response:
    async def work(form: dict[str, str], conn: psycopg.AsyncConnection) -> Done:
        job_id = parse_id(_one(form, "id"), "job")
        actions = await acancel(conn, ids=[job_id], by=identity(request).user)  # type: ignore[union-attr]
        first = actions[0]
        said = f"job {job_id}: {first.action}" + (f" ({first.note})" if first.note else "")
        if len(actions) > 1:
            said += f"; {len(actions) - 1} waiting job(s) followed"
        changed = [a.id for a in actions if a.action != "unchanged"]
        return "cancel", f"job {job_id}", changed, said

    return await _act(request, work)


async def retry(request: Request) -> Response:
    async def work(form: dict[str, str], conn: psycopg.AsyncConnection) -> Done:
        job_id = parse_id(_one(form, "id"), "job")
        # control.retry's statement: a job waiting for its backoff is due now.
        moved = [row["id"] for row in await arows(conn, "retry_now", ids=[job_id])]
        said = f"job {job_id}: attempt due now" if moved else f"job {job_id} was not waiting for a retry"
        return "retry", f"job {job_id}", moved, said

    return await _act(request, work)


def _queue_action(paused: bool) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        async def work(form: dict[str, str], conn: psycopg.AsyncConnection) -> Done:
            queue = _one(form, "queue")
            changed = await aset_paused(conn, queue, paused, by=identity(request).user if paused else None)  # type: ignore[union-attr]
            verb = "paused" if paused else "resumed"
            said = (
                f"{verb} queue {queue}"
                if changed
                else f"queue {queue} was {'paused already' if paused else 'not paused'}"
            )
            return "pause" if paused else "resume", f"queue {queue}", [], said

        return await _act(request, work)

    return endpoint


def _schedule_action(paused: bool) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        async def work(form: dict[str, str], conn: psycopg.AsyncConnection) -> Done:
            name = _one(form, "schedule")
            changed = await schedule_ops.aset_paused(conn, name, paused)
            verb = "paused" if paused else "resumed"
            said = f"{verb} schedule {name}" if changed else f"schedule {name} was already {verb}"
            return f"schedule {'pause' if paused else 'resume'}", f"schedule {name}", [], said

        return await _act(request, work)

    return endpoint


def limit_values(form: dict[str, str]) -> dict[str, Any]:
    """The dimensions a limits form changes: those filled in, `none` removing one.

    >>> limit_values({"kind": "k", "concurrency": "3", "rate": "", "key_rate": "none"})
    {'concurrency': '3', 'key_rate': None}
    """
    given: dict[str, Any] = {}
    for name in LIMIT_FIELDS:
        value = form.get(name, "").strip()
        if value:
            given[name] = None if value.lower() == "none" else value
    return given


async def _limits(request: Request, reset: bool) -> Response:
    """A change of limits runs on a connection of its own in a thread (it may wait seconds for older
    writers, jobsup.ops.limits); its audit row follows in a transaction of its own once it committed."""
    checked = await _checked(request)
    if isinstance(checked, Response):
        return checked
    form, who = checked
    try:
        kind = kind_limits.check_kind(form.get("kind", ""))
        given = limit_values(form)
        if not reset and not given:
            raise BadInput("fill in at least one dimension to change (or `none` to remove one)")
        db = request.app.state.db
        change = await db.write(
            (lambda conn: kind_limits.reset(conn, kind, who.user))
            if reset
            else (lambda conn: kind_limits.set_limits(conn, kind, who.user, **given))
        )
        said = f"limits of kind {kind}: {change.before} → {change.after}"

        async def record(conn: psycopg.AsyncConnection) -> None:
            await audit.arecord(
                conn,
                who=who.user,
                role=who.role,
                action="limit reset" if reset else "limit",
                target=f"kind {kind}",
                detail=said,
            )

        await db.run(record)
    except JobsupError as exc:
        return _not_done(request, exc)
    request.app.state.boards.board = None
    return _back(request, form, said)


async def set_limit(request: Request) -> Response:
    return await _limits(request, reset=False)


async def reset_limit(request: Request) -> Response:
    return await _limits(request, reset=True)


async def logout(request: Request) -> Response:
    try:
        await guard(request, operator=False)
    except Refused as refused:
        return message(request, "Refused", refused.reason, refused.status)
    response = RedirectResponse(href(request, "/login"), status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=href(request, "/"))
    return response


pause_queue = _queue_action(True)
resume_queue = _queue_action(False)
pause_schedule = _schedule_action(True)
resume_schedule = _schedule_action(False)
