"""`jobsup cancel`: waiting and queued jobs at once; running ones stopped by their supervisor."""

from __future__ import annotations

import argparse

from jobsup.cli.actions import SHOWN, add_ids, audit, counts, jobs, print_actions
from jobsup.cli.options import connect, workflow_id
from jobsup.errors import EXIT_OK
from jobsup.ops.control import JobAction

HELP = "cancel jobs: waiting and queued at once, running ones stopped"

# The actions a cancel reports, in the order of its JSON's counts; the last two are what it did to the
# jobs that waited for a job it cancelled (the trigger jobs_finished, migration 0009).
_ACTIONS = ("cancelled", "requested", "unchanged", "cascaded", "released")
_FOLLOWED = ("cascaded", "released")


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Cancel jobs by --id, every waiting, queued and running job of --kind (in --queue), or every "
        "unfinished job of --workflow. A waiting, queued or scheduled job becomes cancelled at once; a running "
        "one's supervisor stops its worker (SIGTERM, then SIGKILL after the kill grace) and records it "
        "cancelled; a finished job is reported, not changed. The jobs that wait for a job cancelled "
        "here are cancelled with it (on_parent_failure cancel, shown as cascaded) or run without it "
        "(on_parent_failure run, shown as released)."
    )
    add_ids(p, required=False)
    p.add_argument("--kind", help="every waiting, queued and running job of this kind")
    p.add_argument("--queue", help="with --kind: only in this queue")
    p.add_argument(
        "--workflow", type=workflow_id, metavar="ID", help="every waiting, queued and running job of this workflow"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: counts (" + ", ".join(f'"{a}"' for a in _ACTIONS) + ') and "jobs"',
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from jobsup.ops.control import cancel

    with connect(args) as conn:
        actions = cancel(conn, ids=args.id, kind=args.kind, queue=args.queue, workflow=args.workflow)
        counted = counts(actions, _ACTIONS)
        changed = [a.id for a in actions if a.action != "unchanged"]
        audit(conn, "cancel", _target(args), changed, ", ".join(f"{n} {name}" for name, n in counted.items() if n))
    if args.json:
        print_actions(actions, "", True, counted)
        return EXIT_OK
    direct = [a for a in actions if a.action not in _FOLLOWED]
    followed = [a for a in actions if a.action in _FOLLOWED]
    # The jobs that followed are listed after those the command named, before the one summary line.
    print_actions(direct, "\n".join([*_followed_lines(followed), _summary(args, direct, counted)]), False, counted)
    return EXIT_OK


def _target(args: argparse.Namespace) -> str:
    if args.workflow is not None:
        return f"workflow {args.workflow}"
    if args.kind is not None:
        return f"kind {args.kind}" + (f" in queue {args.queue}" if args.queue else "")
    return ", ".join(f"job {i}" for i in args.id[:5]) + (" ..." if len(args.id) > 5 else "")


def _summary(args: argparse.Namespace, direct: list[JobAction], counted: dict[str, int]) -> str:
    if not direct and args.kind is not None:
        scope = f"kind {args.kind}" + (f" in queue {args.queue}" if args.queue else "")
        return f"no queued or running job of {scope}: nothing cancelled"
    if not direct and args.workflow is not None:
        return (
            f"workflow {args.workflow} has no job left to cancel (none waiting, queued, or running without a request)"
        )
    cancelled = counted["cancelled"]
    waited = sum(1 for a in direct if a.action == "cancelled" and a.was == "waiting")
    parts = [
        f"cancelled {jobs(cancelled)}" + (f" ({waited} waiting, {cancelled - waited} queued)" if waited else ""),
        f"cancel requested for {counted['requested']} running",
    ]
    if args.workflow is None:  # a workflow's finished jobs are not read, so not counted either
        parts.append(f"{counted['unchanged']} not changed")
    if counted["cascaded"]:
        parts.append(f"{counted['cascaded']} more cancelled with them (they waited for a job cancelled here)")
    if counted["released"]:
        parts.append(f"{jobs(counted['released'])} released to run (on_parent_failure run)")
    return ("" if args.workflow is None else f"workflow {args.workflow}: ") + "; ".join(parts)


def _followed_lines(followed: list[JobAction]) -> list[str]:
    lines = [f"job {a.id} ({a.kind}): {a.note}" for a in followed[:SHOWN]]
    if len(followed) > SHOWN:
        lines.append(f"... and {jobs(len(followed) - SHOWN)} more that waited for them (--json lists them all)")
    return lines
