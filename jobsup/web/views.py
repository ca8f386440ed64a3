"""The views read from the shared board (jobsup.web.board): the overview, dead jobs, queues, limits,
workflows, schedules and latency. None of them queries the database itself, so twenty open pages cost
the database what one does."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from jobsup.durations import format_age
from jobsup.errors import DatabaseUnavailable, JobsupError
from jobsup.ops.latency import METRICS, WINDOWS, window_label
from jobsup.ops.snapshot import KIND_COLUMNS
from jobsup.web.board import Board
from jobsup.web.html import Markup, Node, table, tag
from jobsup.web.layout import can_act, csrf_field, form, hidden, href, page


def when(at: datetime | None) -> str:
    return "" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def bytes_text(n: int | None) -> str:
    """
    >>> bytes_text(52_428_800), bytes_text(None)
    ('50.0 MiB', '')
    """
    return "" if n is None else f"{n / 2**20:.1f} MiB"


def job_link(request: Request, job_id: int) -> Markup:
    return tag("a", str(job_id), href=href(request, f"/jobs/{job_id}"))


def worker_jobs(request: Request, worker: dict[str, Any]) -> Node:
    """What a worker of a heartbeat runs, as jobsup top's workers view says it: its job (and how many
    are handed to it behind that one), or, for a process of shared jobs, how many of its capacity with
    its event loop's lag, or the job blocking that loop."""
    if worker.get("shared") is not None:
        if worker.get("blocked_by") is not None:
            return tag("span", "loop blocked by ", job_link(request, worker["blocked_by"]))
        lag = worker.get("lag") or 0.0
        return f"{worker['shared']} of {worker.get('capacity')} shared, loop lag {lag * 1000:.0f} ms"
    if not worker.get("job_id"):
        return ""
    behind = len(worker.get("behind") or ())
    link = job_link(request, worker["job_id"])
    return tag("span", link, f" (+{behind} behind it, not started)") if behind else link


async def board_page(request: Request, title: str, render: Callable[..., Any]) -> Response:
    """A view of the board; the last board read under a banner when the database cannot be reached."""
    boards = request.app.state.boards
    banner = None
    try:
        board = await boards.current()
    except (DatabaseUnavailable, JobsupError) as exc:
        banner = f"The database cannot be reached: {exc}. The page comes back by itself when it can."
        board = boards.board
    if board is None:
        return page(request, title, tag("p", "No figures yet."), banner=banner, status=503)
    return page(request, title, render(request, board), banner=banner, version=board.version)


def _counts(board: Board) -> Markup:
    total = board.snapshot.total
    cards = [
        tag(
            "div",
            tag("span", f"{getattr(total, name):,}", class_="n", data_count=name),
            tag("span", name),
            class_="card",
        )
        for name in KIND_COLUMNS
    ]
    return tag("div", cards, class_="cards", id="counts")


def overview(request: Request, board: Board) -> Node:
    snap = board.snapshot
    oldest = max(snap.oldest_ready.values(), default=None)
    facts = tag(
        "ul",
        tag(
            "li", "oldest ready job: ", tag("strong", format_age(oldest) if oldest is not None else "none", id="oldest")
        ),
        tag("li", "done in the last minute: ", tag("strong", f"{board.done_last_minute:,}", id="throughput")),
        tag(
            "li", "health: ", tag("strong", board.health or "ok", id="health", class_="warn" if board.health else None)
        ),
        tag(
            "li",
            "workflows: ",
            f"{snap.workflows.open:,} open, {snap.workflows.done:,} done, {snap.workflows.failed:,} failed",
        ),
        class_="facts",
    )
    kinds = table(
        ["kind", *KIND_COLUMNS],
        ([k.kind, *(f"{getattr(k, c):,}" for c in KIND_COLUMNS)] for k in snap.kinds),
        id="kinds",
    )
    supervisors = []
    for row in snap.supervisors:
        workers = table(
            ["worker pid", "state", "job", "rss", "jobs done", "restarts"],
            (
                [
                    w.get("pid"),
                    w.get("state"),
                    worker_jobs(request, w),
                    bytes_text(w.get("rss")),
                    w.get("jobs_done", 0),
                    w.get("restarts", 0),
                ]
                for w in (row.get("workers") or [])
                if isinstance(w, dict)
            ),
            class_="workers",
        )
        supervisors.append(
            tag(
                "section",
                tag(
                    "h3",
                    f"{row['host']} pid {row['pid']} · {row['state']} · queues {', '.join(row['queues'])} · "
                    f"heartbeat {format_age(row['heartbeat_age'])} ago · {row['jobs_done']:,} jobs done",
                ),
                workers,
                class_="supervisor",
            )
        )
    reaper = table(
        ["at", "action", "supervisor", "jobs", "detail"],
        ([when(e["at"]), e["action"], e["supervisor"], e["count"], e.get("detail") or ""] for e in snap.events[:10]),
        empty="no reaper activity",
    )
    unserved = tag("ul", [tag("li", u.describe()) for u in board.unserved] or [tag("li", "none")], id="unserved")
    return [
        _counts(board),
        facts,
        tag("h2", "By kind"),
        kinds,
        tag("h2", "Supervisors and their workers"),
        supervisors or tag("p", "No supervisor is running."),
        tag("h2", "Ready jobs no live supervisor can run"),
        unserved,
        tag("h2", "Reaper activity"),
        reaper,
    ]


def dead(request: Request, board: Board) -> Node:
    snap = board.snapshot
    groups = table(
        ["kind", "last error", "jobs", "last at", ""],
        (
            [
                g["kind"],
                tag("pre", g["last_error"] or ""),
                f"{g['count']:,}",
                when(g["last_at"]),
                tag(
                    "a",
                    "Requeue all…",
                    href=href(request, "/dead/confirm")
                    + "?"
                    + urlencode({"kind": g["kind"], "error": g["last_error"] or ""}),
                    class_="button",
                )
                if can_act(request)
                else "",
            ]
            for g in snap.dead_groups
        ),
        empty="no dead job",
        id="dead-groups",
    )
    kinds = sorted({g["kind"] for g in snap.dead_groups})
    by_kind = [
        tag(
            "a",
            f"Requeue every dead job of {k}…",
            href=href(request, "/dead/confirm") + "?" + urlencode({"kind": k}),
            class_="button",
        )
        for k in kinds
    ]
    jobs = table(
        ["id", "kind", "queue", "attempts", "died", "last error", ""],
        (
            [
                job_link(request, j["id"]),
                j["kind"],
                j["queue"],
                f"{j['attempts']}/{j['max_attempts']}",
                when(j["done_at"]),
                tag("pre", j["last_error"] or ""),
                form(request, "/actions/requeue", "Requeue", hidden("ids", j["id"])),
            ]
            for j in snap.dead_jobs
        ),
        empty="no dead job",
        id="dead-jobs",
    )
    return [
        tag("h2", "By kind and error"),
        groups,
        tag("p", by_kind, class_="actions") if can_act(request) else None,
        tag("h2", "The newest dead jobs"),
        jobs,
    ]


def queues(request: Request, board: Board) -> Node:
    snap = board.snapshot
    paused = {row["queue"]: row for row in snap.paused_queues}
    names = sorted(set(snap.oldest_ready) | set(paused) | {q for s in snap.supervisors for q in s["queues"]})
    rows = []
    for name in names:
        pause = paused.get(name)
        button = (
            form(request, "/actions/resume", "Resume", hidden("queue", name))
            if pause
            else form(request, "/actions/pause", "Pause", hidden("queue", name))
        )
        state = f"paused by {pause['paused_by']} at {when(pause['paused_at'])}" if pause else "claiming"
        age = snap.oldest_ready.get(name)
        rows.append([name, state, format_age(age) if age is not None else "", button])
    other = (
        tag(
            "form",
            tag("label", "Pause another queue: ", tag("input", name="queue", required=True)),
            csrf_field(request),
            tag("button", "Pause", type="submit"),
            method="post",
            action=href(request, "/actions/pause"),
        )
        if can_act(request)
        else None
    )
    return [table(["queue", "state", "oldest ready", ""], rows, empty="no queue", id="queues"), other]


def limits(request: Request, board: Board) -> Node:
    rows = [
        [
            k.kind,
            str(k.limits),
            k.held,
            k.throttled_text,
            format_age(k.throttled_age) if k.throttled_age is not None else "",
            k.set_by or "the app",
            "" if k.declared is None else str(k.declared),
            form(request, "/actions/limit-reset", "Reset", hidden("kind", k.kind)) if k.set_by else "",
        ]
        for k in board.snapshot.limits
    ]
    body: list[Node] = [
        table(
            ["kind", "in force", "held", "throttled", "oldest throttled", "set by", "declared by the app", ""],
            rows,
            empty="no kind has a limit",
            id="limits",
        )
    ]
    if can_act(request):

        def field(name: str, hint: str) -> Markup:
            return tag("label", name, tag("input", name=name, placeholder=hint))

        body += [
            tag("h2", "Change a kind's limits"),
            tag(
                "p",
                "Fill in the dimensions to change; `none` removes one; those left empty keep their value.",
                class_="hint",
            ),
            tag(
                "form",
                csrf_field(request),
                tag("label", "kind", tag("input", name="kind", required=True)),
                field("concurrency", "e.g. 10"),
                field("rate", "e.g. 100/s"),
                field("key_concurrency", "e.g. 1"),
                field("key_rate", "e.g. 5/m"),
                tag("button", "Change", type="submit"),
                method="post",
                action=href(request, "/actions/limit"),
                id="limit-form",
                class_="stack",
            ),
        ]
    return body


def workflows(request: Request, board: Board) -> Node:
    rows = []
    for p in board.workflows:
        share = 0 if p.total == 0 else round(100 * (p.done + p.failed) / p.total)
        bar = tag("progress", f"{share}%", value=p.done + p.failed, max=max(p.total, 1))
        rows.append(
            [
                tag("a", str(p.id), href=href(request, f"/workflows/{p.id}")),
                p.name or "",
                when(p.created_at),
                bar,
                f"{p.done}/{p.total} done, {p.failed} failed, {p.running} running, {p.queued} queued, "
                f"{p.waiting} waiting",
                when(p.finished_at),
            ]
        )
    return table(["id", "name", "created", "progress", "jobs", "finished"], rows, empty="no workflow", id="workflows")


def schedules(request: Request, board: Board) -> Node:
    rows = [
        [
            s.name,
            s.kind,
            f"{s.expression} ({s.tz})",
            s.queue,
            s.state,
            when(s.next_fire),
            when(s.last_fire),
            job_link(request, s.last_job_id) if s.last_job_id else "",
            form(request, "/actions/schedule-resume", "Resume", hidden("schedule", s.name))
            if s.paused
            else form(request, "/actions/schedule-pause", "Pause", hidden("schedule", s.name)),
        ]
        for s in board.schedules
    ]
    return table(
        ["name", "kind", "when", "queue", "state", "next", "last", "last job", ""],
        rows,
        empty="no schedule",
        id="schedules",
    )


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def latency(request: Request, board: Board) -> Node:
    headers = ["kind", "metric"] + [f"{window_label(w)} p50 / p95 / p99 (n)" for w in WINDOWS]
    rows = []
    for k in board.snapshot.latency:
        for metric in METRICS:
            cells: list[Node] = [k.kind + (" ↑ rising" if k.rising and metric == METRICS[0] else ""), metric]
            for w in WINDOWS:
                f = k.get(metric, w)
                cells.append(f"{_seconds(f.p50)} / {_seconds(f.p95)} / {_seconds(f.p99)} ({f.count:,})")
            rows.append(cells)
    return table(headers, rows, empty="no job has finished in the last hour", id="latency")


async def overview_page(request: Request) -> Response:
    return await board_page(request, "Overview", overview)


async def dead_page(request: Request) -> Response:
    return await board_page(request, "Dead jobs", dead)


async def queues_page(request: Request) -> Response:
    return await board_page(request, "Queues", queues)


async def limits_page(request: Request) -> Response:
    return await board_page(request, "Limits", limits)


async def workflows_page(request: Request) -> Response:
    return await board_page(request, "Workflows", workflows)


async def schedules_page(request: Request) -> Response:
    return await board_page(request, "Schedules", schedules)


async def latency_page(request: Request) -> Response:
    return await board_page(request, "Latency", latency)
