"""`jobsup workflow [ID]`: a workflow's jobs as a tree, each under its first parent, or the newest
workflows with their progress."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobsup.cli.options import connect, positive_int, workflow_id
from jobsup.durations import format_age
from jobsup.errors import EXIT_OK, BadInput

if TYPE_CHECKING:
    from jobsup.ops.workflows import Member, Progress, WorkflowView

HELP = "show a workflow's jobs as a tree, or list the newest workflows"

# Siblings of one kind past this many are one line with their counts: a fan-out of 1,000 jobs is one
# line, not a screenful (--json lists every job).
FANOUT_SHOWN = 20
# Ids named on one line: a job's other parents, a collapsed fan-out's dead jobs.
IDS_SHOWN = 5
# Levels of indentation; a longer chain goes on at this depth, each line saying its own.
DEPTH_SHOWN = 12
# Workflows listed without an ID and without --limit.
DEFAULT_LIMIT = 20
UNFINISHED = ("waiting", "queued", "running")
# Workflow ids are bigint, past the integer range of options.positive_int.


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Show workflow ID: its name, when it was created and finished, its jobs counted by status, and "
        "its jobs as a tree, each under its first parent (its other parents named on its line), with "
        f"its status, attempts and times; more than {FANOUT_SHOWN} jobs of one kind side by side are "
        "one line with their counts. Without ID, list the newest workflows with their progress."
    )
    p.add_argument("id", nargs="?", type=workflow_id, metavar="ID", help="the workflow's id")
    p.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help=f"without ID: how many workflows to list (default {DEFAULT_LIMIT})",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print JSON: with ID, the workflow and "jobs", every one of them; without, a list of workflows',
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.ops.workflows import recent, show

    if args.id is not None and args.limit is not None:
        raise BadInput("--limit counts the workflows listed without an ID")
    with connect(args) as conn:
        if args.id is None:
            listed = recent(conn, args.limit or DEFAULT_LIMIT)
        else:
            view = show(conn, args.id)
    if args.id is None:
        print(json.dumps([_progress_json(p) for p in listed]) if args.json else "\n".join(_list_lines(listed)))
    else:
        print(json.dumps(_view_json(view)) if args.json else "\n".join(view_lines(view)))
    return EXIT_OK


# --- one workflow ------------------------------------------------------------------------------------


def view_lines(view: WorkflowView) -> list[str]:
    """The text of `jobsup workflow ID`: two lines of header, then the tree."""
    counts = view.counts()
    name = f" ({view.name})" if view.name else ""
    header = f"workflow {view.id}{name}: created {_iso(view.created_at)}, {_state(view, counts)}"
    total = len(view.members)
    return [header, f"{total:,} job{'' if total == 1 else 's'}: {_counts(counts)}", *_tree(view)]


def _state(view: WorkflowView, counts: Counter[str]) -> str:
    """finished (when), or running. The pruner sets finished_at some time after the last job ends: until
    then, a workflow none of whose jobs is left is finished when its last one was."""
    finished = view.finished_at
    if finished is None and view.members and not any(counts[s] for s in UNFINISHED):
        finished = max((m.done_at for m in view.members if m.done_at is not None), default=None)
    elif finished is None:
        return "running"
    failed = view.failed if view.failed is not None else bool(counts["dead"] or counts["cancelled"])
    return f"finished {_iso(finished)}" + (", failed" if failed else "")


def _tree(view: WorkflowView) -> list[str]:
    """The workflow's tree (jobsup.ops.workflow_tree) as text: each job under its first parent of the
    workflow, the jobs under no other, in id order, at the top; more than FANOUT_SHOWN side by side of one
    kind as one line."""
    from jobsup.ops.workflow_tree import tree

    return [
        _indent(line.depth) + (_fanout_line(line.members) if line.folded else _job_line(line.members[0], line.under))
        for line in tree(view, fanout=FANOUT_SHOWN)
    ]


def _indent(depth: int) -> str:
    """Two spaces a level; past DEPTH_SHOWN levels, a line says its depth instead.

    >>> _indent(2), _indent(30)
    ('    ', '                        [30] ')
    """
    if depth <= DEPTH_SHOWN:
        return "  " * depth
    return "  " * DEPTH_SHOWN + f"[{depth}] "


def _job_line(m: Member, under: int | None) -> str:
    """One job: its status and what goes with it, its attempts, its times, its parents but the one it is
    shown `under`."""
    parts = [_status(m)]
    if m.attempts:
        parts.append(f"attempt {m.attempts}/{m.max_attempts}")
    if m.status == "running" and m.started_at is not None:
        parts.append(f"since {_clock(m.started_at)}")
    if m.done_at is not None:
        took = f" after {format_age((m.done_at - m.started_at).total_seconds())}" if m.started_at else ""
        parts.append(f"ended {_clock(m.done_at)}{took}")
    others = [p for p in m.parents if p != under]
    if others:
        parts.append(f"after {_some(others)}")
    line = f"job {m.id} ({m.kind}): {', '.join(parts)}"
    if m.status in ("dead", "cancelled") and m.last_error:
        line += f": {_short(m.last_error)}"
    return line


def _status(m: Member) -> str:
    if m.status == "waiting":
        return f"waiting for {m.parents_left} of {len(m.parents)} parent{'' if len(m.parents) == 1 else 's'}"
    return m.status


def _fanout_line(members: Sequence[Member]) -> str:
    """Jobs of one kind side by side, as one line: how many, their ids, their statuses counted, and the
    first of those that died (what a reader looks for among a thousand)."""
    ids = [m.id for m in members]
    kind = members[0].kind
    span = f"{ids[0]} to {ids[-1]}" if ids[-1] - ids[0] + 1 == len(ids) else f"{ids[0]} … {ids[-1]}"
    line = f"{len(ids):,} jobs ({kind}), ids {span}: {_counts(Counter(m.status for m in members))}"
    dead = [m.id for m in members if m.status == "dead"]
    if dead:
        line += f"; dead: {_some(dead)}"
    return line


def _counts(counts: Counter[str]) -> str:
    """
    >>> _counts(Counter({"done": 1200, "waiting": 1}))
    '1 waiting, 1,200 done'
    """
    from jobsup.ops.workflow_tree import STATUSES

    known = [f"{counts[s]:,} {s}" for s in STATUSES if counts[s]]
    others = [f"{n:,} {s}" for s, n in sorted(counts.items()) if s not in STATUSES]  # a newer schema's
    return ", ".join(known + others) or "none"


def _some(ids: Sequence[int]) -> str:
    """
    >>> _some([12, 13]), _some(range(1, 10))
    ('12, 13', '1, 2, 3, 4, 5 and 4 more')
    """
    shown = ", ".join(map(str, ids[:IDS_SHOWN]))
    return shown + (f" and {len(ids) - IDS_SHOWN} more" if len(ids) > IDS_SHOWN else "")


def _short(text: str, width: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def _clock(at: datetime) -> str:
    return at.strftime("%H:%M:%S")


def _iso(at: datetime | None) -> str:
    return at.isoformat(sep=" ", timespec="seconds") if at is not None else "-"


def _view_json(view: WorkflowView) -> dict[str, Any]:
    return {
        "id": view.id,
        "name": view.name,
        "created_at": view.created_at.isoformat(),
        "finished_at": _json_time(view.finished_at),
        "failed": view.failed,
        "counts": dict(view.counts()),
        "jobs": [
            {
                **m._asdict(),
                "created_at": m.created_at.isoformat(),
                "started_at": _json_time(m.started_at),
                "done_at": _json_time(m.done_at),
            }
            for m in view.members
        ],
    }


def _json_time(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


# --- the newest workflows ----------------------------------------------------------------------------


def _list_lines(listed: Iterable[Progress]) -> list[str]:
    lines = [_progress_line(p) for p in listed]
    return lines or ["no workflows"]


def _progress_line(p: Progress) -> str:
    name = f" ({p.name})" if p.name else ""
    counts = [f"{p.done:,} of {p.total:,} done"] + [
        f"{n:,} {what}"
        for n, what in ((p.failed, "failed"), (p.running, "running"), (p.queued, "queued"), (p.waiting, "waiting"))
        if n
    ]
    if p.finished_at is not None:
        state = f"finished {_iso(p.finished_at)}"
    elif p.total and not (p.running or p.queued or p.waiting):
        state = "finished"
    else:
        state = "running"
    return f"workflow {p.id}{name}: {', '.join(counts)}; created {_iso(p.created_at)}, {state}"


def _progress_json(p: Progress) -> dict[str, Any]:
    return {**p._asdict(), "created_at": p.created_at.isoformat(), "finished_at": _json_time(p.finished_at)}
