"""The console's workflows against a real PostgreSQL: the Workflows tab lists each workflow with its
progress, Enter opens one as a live tree (a fan-out of one kind folded into one line, which Enter
unfolds), Enter on a job opens the job screen with its parents and children; both fit 80×24 and 160×48.
"""

from __future__ import annotations

import io
import re

import psycopg
import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable

from jobsup import Workflow, client
from jobsup.db import lifecycle
from jobsup.monitor import panels
from jobsup.monitor.app import TopApp
from jobsup.monitor.screens import JobScreen
from jobsup.monitor.source import Source
from jobsup.monitor.workflow_panels import WorkflowScreen
from jobsup.ops.limits import set_limits

from .console_helpers import app_for, rows, run, screen_text, select, until

pytestmark = pytest.mark.slow  # the console driven by the Pilot takes seconds a test

FANOUT = 50


class Ingest:
    """A workflow of 1 scan → 50 parse → 1 report, taken half way: the scan done, 25 parse jobs ended
    (one of them dead), 3 running, the other 22 queued, the report waiting for 25 of its 50 parents."""

    def __init__(self, conn: psycopg.Connection) -> None:
        wf = Workflow("ingest")
        scan = wf.add("scan", {})
        parses = [wf.add("parse", {"n": n}, after=scan, max_attempts=1) for n in range(FANOUT)]
        report = wf.add("report", {}, after=parses, on_parent_failure="run")
        self.id = wf.enqueue(conn)
        assert self.id is not None and scan.id is not None and report.id is not None
        self.scan, self.report = scan.id, report.id
        self.parses = [p.id for p in parses]
        self.finish(conn, 1)  # the scan: its 50 children are queued
        self.finish(conn, 24)
        [dead] = lifecycle.claim(conn, ["default"], 1, "sup-test", 60)
        lifecycle.fail(conn, [lifecycle.Failure(dead.id, dead.attempts, "ValueError: bad page 7")], "sup-test")
        self.dead = dead.id
        self.running = [j.id for j in lifecycle.claim(conn, ["default"], 3, "sup-test", 60)]

    @staticmethod
    def finish(conn: psycopg.Connection, n: int) -> list[int]:
        """Claim the next `n` queued jobs (in id order: all have one priority and run_at now) and end them done."""
        jobs = lifecycle.claim(conn, ["default"], n, "sup-test", 60)
        assert len(jobs) == n
        lifecycle.complete(conn, [(j.id, j.attempts) for j in jobs], "sup-test")
        return [j.id for j in jobs]


def chain_done(conn: psycopg.Connection) -> int:
    """A workflow of two jobs, both done: a finished one."""
    wf = Workflow("nightly")
    wf.chain({"kind": "step", "payload": {}}, {"kind": "step", "payload": {}})
    workflow_id = wf.enqueue(conn)
    assert workflow_id is not None
    Ingest.finish(conn, 1)
    Ingest.finish(conn, 1)
    return workflow_id


def tree_screen(app: TopApp) -> WorkflowScreen | None:
    return app.screen if isinstance(app.screen, WorkflowScreen) else None


def job_screen(app: TopApp) -> JobScreen | None:
    return app.screen if isinstance(app.screen, JobScreen) else None


async def open_tree(pilot: Pilot, workflow_id: int) -> WorkflowScreen:
    """Show the Workflows tab, select a workflow and press Enter: its tree, read once."""
    app = pilot.app
    app.action_show_tab("workflows")  # its list is read while it is in view
    await until(pilot, lambda: str(workflow_id) in rows(app, "workflows"), message="the workflow listed")
    await select(pilot, "workflows", str(workflow_id))
    await pilot.press("enter")
    screen = await until(pilot, lambda: tree_screen(app), message="the tree")
    await until(pilot, lambda: screen.loads >= 1, message="the tree read")
    await pilot.pause(0.1)
    return screen


def details_text(screen: JobScreen) -> str:
    """The whole of a job screen's details as text, the part below its fold too."""
    console = Console(width=100, file=io.StringIO(), record=True)
    console.print(screen._details())
    return console.export_text()


def tree_rows(app: TopApp) -> dict[str, list[str]]:
    """The tree's rows by key, as text (rows() reads the main screen's tables)."""
    table = app.screen.query_one("#workflow-tree", DataTable)
    return {row.key.value: [str(cell) for cell in table.get_row(row.key)] for row in table.ordered_rows}


async def cursor_to(pilot: Pilot, key: str) -> DataTable:
    table = pilot.app.screen.query_one("#workflow-tree", DataTable)
    table.move_cursor(row=table.get_row_index(key))
    await until(pilot, lambda: panels.selected_key(table) == key, message=f"the cursor on {key!r}")
    return table


def tab_bar(text: str) -> str:
    return next(line for line in text.splitlines() if "1 Jobs" in line)


def test_the_tab_lists_each_workflow_with_its_progress_live(conn, dsn):
    nightly = chain_done(conn)
    flow = Ingest(conn)

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(160, 48)) as pilot:
            await until(pilot, lambda: app.figures is not None and app.figures.workflows_listed == 2, message="listed")
            assert app.figures.workflows is None  # out of view: its list is not read
            await pilot.pause(0.1)
            text = await screen_text(pilot)
            assert "7 Workflows 1" in tab_bar(text)  # the badge: one of them has jobs not yet ended
            # Jobs waiting for their parents are counted wherever jobs are counted by status.
            assert "waiting 1" in text.splitlines()[1]
            assert rows(app, "kinds")["report"][:2] == ["report", "1"]
            await pilot.press("7")
            await until(pilot, lambda: app.focused is app.query_one("#workflows"), message="the Workflows tab")
            assert app.source.list_workflows
            await until(pilot, lambda: str(flow.id) in rows(app, "workflows"), message="the list")
            listed = rows(app, "workflows")
            assert list(listed) == [str(flow.id), str(nightly)]  # newest first
            # id, name, created, done/total, failed (dead or cancelled), running, queued, waiting, progress
            *cells, bar = listed[str(flow.id)]
            assert cells[:2] == [str(flow.id), "ingest"] and cells[2].endswith(" ago")
            assert cells[3:] == ["25/52", "1", "3", "22", "1"]
            assert bar.endswith(" 50%") and "█" in bar
            assert listed[str(nightly)][3] == "2/2" and listed[str(nightly)][-1].endswith(" 100% finished")
            assert "[7 Workflows 1]" in tab_bar(await screen_text(pilot))

            Ingest.finish(conn, 22)  # every queued parse job done: 3 running left, and the report waiting
            await until(pilot, lambda: rows(app, "workflows")[str(flow.id)][3] == "47/52", message="the progress")
            assert rows(app, "workflows")[str(flow.id)][-1].endswith(" 92%")

            await pilot.press("1")  # the Jobs tab is pinned above it: the list stays in view, and read
            await until(pilot, lambda: app.focused is app.query_one("#kinds"), message="the Jobs tab")
            assert app.source.list_workflows
            await pilot.press("2")  # the Dead tab in its place: out of view, no longer read
            await until(pilot, lambda: not app.source.list_workflows, message="the list no longer read")

    run(scenario)


def test_a_workflow_opens_as_a_live_tree_whose_fan_out_unfolds(conn, dsn):
    flow = Ingest(conn)

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.figures is not None and app.figures.workflows_listed, message="listed")
            screen = await open_tree(pilot, flow.id)
            tree = tree_rows(app)
            fold = f"fold:{flow.scan}/parse"
            assert list(tree) == [str(flow.scan), fold, str(flow.report)]
            # Below 100 columns no "started" column: the note has its room.
            assert tree[str(flow.scan)][:3] == [f"{flow.scan} scan", "done", "1/3"] and len(tree[str(flow.scan)]) == 5
            # The fan-out is one line: its jobs counted by status; the fan-in under it waits for 25 of 50.
            assert tree[fold][:2] == [f"└─ ▸ {FANOUT} × parse", "24/50 done"]
            assert tree[fold][-1] == "22 queued · 3 running · 1 dead"
            assert tree[str(flow.report)][:2] == [f"   └─ {flow.report} report", "waiting"]
            assert tree[str(flow.report)][-1] == "after 49 more · waits for 25"
            table = app.screen.query_one("#workflow-tree", DataTable)
            assert table.get_row(str(flow.report))[1].style == "dim"  # waiting: nothing can run it yet
            head = str(app.screen.query_one("#workflow-head").render())
            assert "25/52 done  1 waiting  22 queued  3 running  1 dead" in head

            await cursor_to(pilot, fold)
            await pilot.press("enter")  # unfolds: each parse job, the report under the first of them
            await until(pilot, lambda: len(tree_rows(app)) == 2 + FANOUT + 1, message="unfolded")
            tree = tree_rows(app)
            assert tree[fold][0] == f"└─ ▾ {FANOUT} × parse"
            assert list(tree)[2:4] == [str(flow.parses[0]), str(flow.report)]
            assert tree[str(flow.dead)][1] == "dead" and "ValueError: bad page 7" in tree[str(flow.dead)][-1]
            assert [tree[str(i)][1] for i in flow.running] == ["running"] * 3

            # Live: the rest of the fan-out ends, which releases the report; the fold stays open.
            Ingest.finish(conn, 22)
            conn.execute("UPDATE jobsup.jobs SET status = 'done', done_at = now() WHERE id = ANY(%s)", (flow.running,))
            await until(pilot, lambda: tree_rows(app)[str(flow.report)][1] == "queued", message="released")
            assert tree_rows(app)[fold][1] == "49/50 done" and screen.loads > 1
            await pilot.press("enter")  # the cursor stayed on the fold: it folds again
            await until(pilot, lambda: len(tree_rows(app)) == 3, message="folded")
            await pilot.press("escape")
            await until(pilot, lambda: app.screen is app.main, message="back to the tab")

    run(scenario)


def test_a_job_of_the_tree_opens_its_screen_with_its_parents_and_children(conn, dsn):
    flow = Ingest(conn)

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.figures is not None and app.figures.workflows_listed, message="listed")
            await open_tree(pilot, flow.id)
            await cursor_to(pilot, str(flow.report))
            await pilot.press("enter")
            screen = await until(pilot, lambda: job_screen(app), message="the report's job screen")
            assert screen.job["id"] == flow.report and screen.job["status"] == "waiting"
            parents, children = screen.family
            assert [p.id for p in parents] == flow.parses and children == []
            text = details_text(screen)
            assert f"workflow      {flow.id}" in text and "parents left  25 of 50" in text
            # Its policy, on_parent_failure="run", said once; the parents that failed first, then those not ended.
            assert "parents (50) this job runs even if they fail" in text and "children" not in text
            lines = text.splitlines()
            first = lines.index("parents (50) this job runs even if they fail") + 1
            assert [line.split() for line in lines[first : first + 5]] == [
                [str(flow.dead), "parse", "dead"],
                *([str(i), "parse", "running"] for i in flow.running),
                [str(flow.dead + 4), "parse", "queued"],
            ]
            assert lines[first + 12] == "+38 more: 24 done, 14 queued"

            await pilot.press("escape")
            await until(pilot, lambda: tree_screen(app), message="back to the tree")
            await cursor_to(pilot, str(flow.scan))
            await pilot.press("enter")
            screen = await until(pilot, lambda: job_screen(app), message="the scan's job screen")
            text = details_text(screen)
            lines = text.splitlines()
            assert "parents" not in text and "children (50)" in lines  # the default policy: no words
            assert lines[lines.index("children (50)") + 1].split() == [str(flow.dead), "parse", "dead"]

    run(scenario)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_the_tab_and_the_tree_fit(conn, dsn, size):
    flow = Ingest(conn)
    width, height = size

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.figures is not None and app.figures.workflows_listed, message="listed")
            await pilot.press("7")
            await until(pilot, lambda: str(flow.id) in rows(app, "workflows"), message="the list")
            await pilot.pause(0.1)
            text = await screen_text(pilot)
            lines = text.splitlines()
            assert len(lines) == height and all(len(line) <= width for line in lines)
            row = next(line for line in lines if " ingest " in line)
            assert "25/52" in row and row.rstrip(" │").endswith("50%")  # the bar and its share, not cut off
            assert "q Quit" in lines[-1]

            await open_tree(pilot, flow.id)
            text = await screen_text(pilot)
            lines = text.splitlines()
            assert len(lines) == height and all(len(line) <= width for line in lines)
            assert f"workflow {flow.id} · ingest" in text and f"▸ {FANOUT} × parse" in text
            assert "after 49 more" in text and "Esc Close" in lines[-1]

    run(scenario)


def test_every_tab_stays_in_the_tab_bar_at_80_columns(conn, dsn):
    # Seven tabs with their badges (a limit throttles a job, a workflow is open) need 86 columns: the
    # bar gives up its gaps, then the titles of the tabs not shown, never a tab.
    set_limits(conn, "charge", "alice@box", concurrency=1)
    client.enqueue_many(conn, [{"kind": "charge"}] * 2)
    lifecycle.claim_limited(conn, ["charge"], ["default"], 1, "sup-a", 30)
    flow = Ingest(conn)

    def bar(text: str) -> str:
        return next(line for line in text.splitlines() if "[1 Jobs]" in line or "[7 Workflows" in line)

    async def scenario() -> None:
        app = app_for(dsn)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.figures is not None and app.figures.workflows_listed, message="listed")
            await pilot.pause(0.1)
            jobs = bar(await screen_text(pilot))
            # The Limits tab's badge (one job throttled) and the Workflows tab's (one open), titled or not.
            assert re.search(r" 6( Limits)? 1 .* 7( Workflows)? 1$", jobs.rstrip()), jobs
            await pilot.press("7")
            await until(pilot, lambda: str(flow.id) in rows(app, "workflows"), message="the list")
            workflows = bar(await screen_text(pilot))
            assert workflows.rstrip().endswith("[7 Workflows 1]") and " 6 " in workflows, workflows

    run(scenario)


def test_the_source_reads_the_list_only_when_asked(conn, dsn):
    flow = Ingest(conn)

    async def scenario() -> None:
        source = Source(dsn)
        try:
            figures = await source.refresh()
            assert figures.workflows is None
            assert (figures.workflows_listed, figures.workflows_unfinished) == (1, 1)
            source.list_workflows = True
            [listed] = (await source.refresh()).workflows or []
            assert (listed.id, listed.total, listed.done, listed.waiting) == (flow.id, 52, 25, 1)
            assert await source.workflow(flow.id + 1) is None  # no such workflow: the tree says so
        finally:
            await source.close()

    run(scenario)
