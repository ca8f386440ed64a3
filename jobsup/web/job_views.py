"""The views of one thing, read when asked (not from the board): a job, a workflow, the audit, and the
confirmation of a bulk requeue. They read again when the board's version changes, not every interval."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from starlette.requests import Request
from starlette.responses import Response

from jobsup.errors import BadInput, DatabaseUnavailable, JobsupError
from jobsup.ops import audit
from jobsup.ops.explain import aexplain_text
from jobsup.ops.snapshot import arows
from jobsup.ops.workflows import ashow
from jobsup.web.html import Markup, Node, table, tag
from jobsup.web.layout import can_act, csrf_field, form, hidden, href, message, page
from jobsup.web.views import job_link, when
from jobsup.workflow import achildren, aparents

ID_MAX = 2**63 - 1  # bigint, the type of job and workflow ids


def parse_id(text: str, what: str) -> int:
    """A job's or workflow's id from a URL or a form; BadInput (a 400 page) for anything else.

    >>> parse_id("42", "job"), parse_id("0042", "job")
    (42, 42)
    >>> parse_id("4x", "job")
    Traceback (most recent call last):
    jobsup.errors.BadInput: a job id is a whole number from 1 up, not '4x'
    """
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= ID_MAX:
        raise BadInput(f"a {what} id is a whole number from 1 up, not {text[:40]!r}")
    return int(text)


async def _read(
    request: Request, title: str, work: Callable[[psycopg.AsyncConnection], Awaitable[Any]]
) -> tuple[Any, Response | None]:
    """`work(conn)` on the web console's connection, or the page that says why it could not be read."""
    try:
        return await request.app.state.db.run(work), None
    except DatabaseUnavailable as exc:
        banner = f"The database cannot be reached: {exc}. The page comes back by itself when it can."
        return None, page(request, title, tag("p", "Not read."), banner=banner, status=503, live="change")
    except JobsupError as exc:
        return None, message(request, title, str(exc), 500)


def _trace_id(meta: Any) -> str | None:
    """The trace id of a W3C traceparent in a job's meta (jobsup.otel), if it has one."""
    parent = meta.get("traceparent") if isinstance(meta, dict) else None
    parts = parent.split("-") if isinstance(parent, str) else []
    return parts[1] if len(parts) == 4 else None


def _error_text(entry: Any) -> str:
    if not isinstance(entry, dict):
        return json.dumps(entry)
    text = str(entry.get("error") or "")
    return text + (f"\n\n{entry['traceback']}" if entry.get("traceback") else "")


def _actions(request: Request, job: dict[str, Any]) -> Node:
    status, job_id = job["status"], job["id"]
    if status == "dead":
        return form(request, "/actions/requeue", "Requeue", hidden("ids", job_id))
    buttons: list[Node] = []
    if status in ("waiting", "queued", "running"):
        buttons.append(form(request, "/actions/cancel", "Cancel", hidden("id", job_id), danger=True))
    if status == "queued" and job["attempts"] > 0:
        buttons.append(form(request, "/actions/retry", "Retry now", hidden("id", job_id)))
    return buttons


async def job_page(request: Request) -> Response:
    try:
        job_id = parse_id(request.path_params["id"], "job")
    except BadInput as exc:
        return message(request, "Bad job id", str(exc), 400)

    async def work(conn: psycopg.AsyncConnection) -> Any:
        found = await arows(conn, "job", id=job_id)
        if not found:
            return None
        return found[0], await aexplain_text(conn, job_id), await aparents(conn, job_id), await achildren(conn, job_id)

    title = f"Job {job_id}"
    read, failed = await _read(request, title, work)
    if failed is not None:
        return failed
    if read is None:
        return message(request, "No such job", f"no job with id {job_id} (never enqueued, or pruned since)", 404)
    job, explanation, parents, children = read
    errors = job["errors"] or []
    facts = table(
        ["", ""],
        [
            ["kind", job["kind"]],
            ["queue", job["queue"]],
            ["status", tag("strong", job["status"], id="status")],
            ["attempts", f"{job['attempts']}/{job['max_attempts']}"],
            ["priority", job["priority"]],
            ["created", when(job["created_at"])],
            ["run at", when(job["run_at"])],
            ["started", when(job["started_at"])],
            ["finished", when(job["done_at"])],
            ["locked by", job["locked_by"] or ""],
            ["key", job["key"] or ""],
            ["unique key", job["unique_key"] or ""],
            [
                "workflow",
                tag("a", str(job["workflow_id"]), href=href(request, f"/workflows/{job['workflow_id']}"))
                if job["workflow_id"]
                else "",
            ],
            ["trace id", _trace_id(job["meta"]) or ""],
        ],
        class_="props",
    )
    attempts = table(
        ["attempt", "at", "error"],
        (
            [e.get("attempt", i + 1), e.get("at", ""), tag("pre", _error_text(e))]
            for i, e in enumerate(errors if isinstance(errors, list) else [])
        ),
        empty="no failed attempt",
        id="errors",
    )
    family = table(
        ["", "id", "kind", "status"],
        [["parent", job_link(request, p.id), p.kind, p.status] for p in parents]
        + [["child", job_link(request, c.id), c.kind, c.status] for c in children],
        empty="no parent, no child",
        id="family",
    )
    body = [
        tag("div", _actions(request, job), class_="actions"),
        tag("h2", "Why it is where it is"),
        tag("pre", explanation, id="explain"),
        tag("h2", "The job"),
        facts,
        tag("h2", "Payload"),
        tag("pre", json.dumps(job["payload"], indent=2, ensure_ascii=False), id="payload"),
        tag("h2", "Errors, one per failed attempt"),
        attempts,
        tag("h2", "Parents and children"),
        family,
        tag("h2", "Meta"),
        tag("pre", json.dumps(job["meta"], indent=2, ensure_ascii=False)),
    ]
    return page(request, title, body, live="change", version=_version(request))


def _version(request: Request) -> str:
    board = request.app.state.boards.board
    return "" if board is None else board.version


def tree(request: Request, members: list) -> Markup:
    """The workflow's jobs as a tree: each job under its first parent in the workflow, roots first; a
    job with several parents names the others."""
    ids = {m.id for m in members}
    under: dict[int | None, list] = {}
    for m in members:
        inside = [p for p in m.parents if p in ids]
        under.setdefault(inside[0] if inside else None, []).append(m)

    def branch(parent: int | None, seen: frozenset[int]) -> Node:
        items = []
        for m in under.get(parent, []):
            if m.id in seen:
                continue
            others = [p for p in m.parents if p != parent]
            items.append(
                tag(
                    "li",
                    job_link(request, m.id),
                    f" {m.kind} ",
                    tag("span", m.status, class_=f"status {m.status}"),
                    f" (also after {', '.join(map(str, others))})" if others and parent is not None else "",
                    branch(m.id, seen | {m.id}),
                )
            )
        return tag("ul", items) if items else None

    return tag("div", branch(None, frozenset()), class_="tree", id="tree")


async def workflow_page(request: Request) -> Response:
    try:
        workflow_id = parse_id(request.path_params["id"], "workflow")
    except BadInput as exc:
        return message(request, "Bad workflow id", str(exc), 400)

    async def work(conn: psycopg.AsyncConnection) -> Any:
        try:
            return await ashow(conn, workflow_id)
        except BadInput:
            return None

    title = f"Workflow {workflow_id}"
    view, failed = await _read(request, title, work)
    if failed is not None:
        return failed
    if view is None:
        return message(request, "No such workflow", f"no workflow {workflow_id} (or pruned since)", 404)
    counts = view.counts()
    done = counts.get("done", 0) + counts.get("dead", 0) + counts.get("cancelled", 0)
    summary = tag(
        "p",
        f"{view.name or 'unnamed'} · created {when(view.created_at)} · ",
        tag("progress", value=done, max=max(len(view.members), 1)),
        " " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
        id="progress",
    )
    return page(request, title, [summary, tree(request, view.members)], live="change", version=_version(request))


async def audit_page(request: Request) -> Response:
    entries, failed = await _read(request, "Audit", audit.arecent)
    if failed is not None:
        return failed
    rows = [
        [
            when(e.at),
            e.who,
            e.role,
            e.action,
            e.target,
            ", ".join(map(str, e.job_ids[:20])) + (f" and {len(e.job_ids) - 20:,} more" if len(e.job_ids) > 20 else ""),
            e.detail,
        ]
        for e in entries
    ]
    body = table(
        ["at", "who", "role", "action", "target", "jobs", "what it did"], rows, empty="no action yet", id="audit"
    )
    return page(request, "Audit", body, live="change", version=_version(request))


async def confirm_requeue(request: Request) -> Response:
    """The confirmation of a bulk requeue: the exact number of jobs it will requeue, and their ids."""
    if not can_act(request):
        return message(request, "Not allowed", "a viewer cannot requeue jobs", 403)
    kind = request.query_params.get("kind")
    error = request.query_params.get("error")
    if not kind:
        return message(request, "Bad request", "which kind? (?kind=...)", 400)

    async def work(conn: psycopg.AsyncConnection) -> Any:
        found = await arows(conn, "console_dead_ids", kind=kind, error=error or None, by_error=error is not None)
        return [row["id"] for row in found]

    ids, failed = await _read(request, "Requeue", work)
    if failed is not None:
        return failed
    what = f"of kind {kind}" + (f" whose last error is {error!r}" if error is not None else "")
    if not ids:
        return message(request, "Nothing to requeue", f"no dead job {what}", 200)
    noun = "job" if len(ids) == 1 else "jobs"
    body = tag(
        "form",
        csrf_field(request),
        hidden("ids", ",".join(map(str, ids))),
        hidden("kind", kind),
        tag("p", f"Requeue {len(ids):,} dead {noun} {what}?", id="confirm-text"),
        tag("button", f"Requeue {len(ids):,} {noun}", type="submit"),
        " ",
        tag("a", "Cancel", href=href(request, "/dead")),
        method="post",
        action=href(request, "/actions/requeue"),
    )
    return page(request, "Requeue dead jobs", body, live="off")
