"""The command line of workflows against a real PostgreSQL: `jobsup workflow` (a tree, a fan-out of a
thousand folded into a line, the list), `enqueue --after`, `cancel` of waiting jobs and of a whole
workflow, and `explain` of a waiting job and of one its parent's failure cancelled."""

from __future__ import annotations

import json
import re

import psycopg
import pytest

import jobsup
from jobsup import Workflow
from jobsup.cli import main
from jobsup.db import lifecycle
from jobsup.db.lifecycle import Failure

from .helpers import jobsup as jobsup_cli
from .helpers import refused_all

SUP = "host-a:100:aa"  # a supervisor's id as a claim writes it to locked_by; no process behind it
TIME = r"\d\d:\d\d:\d\d"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """`jobsup ARGS` in this process (the parser, the command and its printing, as the script runs them)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def row(conn: psycopg.Connection, job_id: int) -> dict:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute("SELECT * FROM jobsup.jobs WHERE id = %s", (job_id,)).fetchone()


def statuses(conn: psycopg.Connection, ids) -> list[str]:
    found = dict(conn.execute("SELECT id, status FROM jobsup.jobs WHERE id = ANY(%s)", (list(ids),)).fetchall())
    return [found.get(i) for i in ids]


def run_one(conn: psycopg.Connection, queue: str) -> jobsup.Job:
    """Claim the one queued job of `queue`, as a supervisor would: it is running."""
    [job] = lifecycle.claim(conn, [queue], 1, SUP, 30.0)
    return job


def finish(conn: psycopg.Connection, queue: str) -> int:
    job = run_one(conn, queue)
    lifecycle.complete(conn, [(job.id, job.attempts)], SUP)
    return job.id


def cancelled_total(conn: psycopg.Connection, kind: str) -> int:
    return conn.execute(
        "SELECT coalesce(sum(cancelled), 0) FROM jobsup.kind_totals WHERE kind = %s", (kind,)
    ).fetchone()[0]


def jobs_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0]


@pytest.fixture
def diamond(conn):
    """fetch, then split and load side by side, then report after both: fetch done, split running,
    load queued, report waiting for them."""
    wf = Workflow("nightly")
    fetch = wf.add("fetch", queue="a")
    split = wf.add("split", after=fetch, queue="b")
    load = wf.add("load", after=fetch)
    report = wf.add("report", after=[split, load])
    workflow_id = wf.enqueue(conn)
    finish(conn, "a")
    run_one(conn, "b")
    return workflow_id, fetch.id, split.id, load.id, report.id


# --- jobsup workflow ID --------------------------------------------------------------------------------


def test_a_workflow_shows_as_a_tree_under_first_parents(dsn, capsys, diamond):
    workflow_id, fetch, split, load, report = diamond
    code, out, err = cli(capsys, "workflow", str(workflow_id), "--dsn", dsn)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert re.fullmatch(rf"workflow {workflow_id} \(nightly\): created \d{{4}}-\d\d-\d\d {TIME}\S*, running", lines[0])
    assert lines[1] == "4 jobs: 1 waiting, 1 queued, 1 running, 1 done"
    expected = [
        rf"job {fetch} \(fetch\): done, attempt 1/3, ended {TIME} after \d+\.\ds",
        rf"  job {split} \(split\): running, attempt 1/3, since {TIME}",
        # shown once, under its first parent; the other one is named
        rf"    job {report} \(report\): waiting for 2 of 2 parents, after {load}",
        rf"  job {load} \(load\): queued",
    ]
    assert len(lines) == 2 + len(expected), out
    for pattern, line in zip(expected, lines[2:], strict=True):
        assert re.fullmatch(pattern, line), (pattern, line)


def test_a_workflow_as_json_has_every_job_with_its_parents(dsn, capsys, diamond):
    workflow_id, fetch, split, load, report = diamond
    code, out, _ = cli(capsys, "workflow", str(workflow_id), "--json", "--dsn", dsn)
    assert code == 0
    view = json.loads(out)
    assert (view["id"], view["name"], view["finished_at"], view["failed"]) == (workflow_id, "nightly", None, None)
    assert view["counts"] == {"done": 1, "running": 1, "queued": 1, "waiting": 1}
    jobs = {j["id"]: j for j in view["jobs"]}
    assert [j["id"] for j in view["jobs"]] == [fetch, split, load, report]
    assert jobs[report]["parents"] == [split, load] and jobs[report]["parents_left"] == 2
    assert (jobs[fetch]["status"], jobs[fetch]["attempts"], jobs[fetch]["max_attempts"]) == ("done", 1, 3)
    assert jobs[fetch]["done_at"] is not None and jobs[split]["started_at"] is not None
    assert jobs[load]["started_at"] is None


def test_a_fan_out_of_a_thousand_is_one_line_and_json_lists_them_all(conn, dsn, capsys):
    wf = Workflow("album")
    group = wf.group([{"kind": "resize", "payload": {"n": n}} for n in range(1000)], then="album")
    workflow_id = wf.enqueue(conn)
    first, last = group.members[0].id, group.members[-1].id
    assert group.then is not None
    conn.execute("UPDATE jobsup.jobs SET queue = 'first' WHERE id = %s", (first,))
    finish(conn, "first")
    code, out, _ = cli(capsys, "workflow", str(workflow_id), "--dsn", dsn)
    assert code == 0
    assert out.splitlines()[1:] == [
        "1,001 jobs: 1 waiting, 999 queued, 1 done",
        f"1,000 jobs (resize), ids {first} to {last}: 999 queued, 1 done",
        # under the first of them, so under their line; its 999 other parents are counted, not listed
        f"  job {group.then.id} (album): waiting for 999 of 1000 parents, after {first + 1}, {first + 2}, "
        f"{first + 3}, {first + 4}, {first + 5} and 994 more",
    ]
    code, out, _ = cli(capsys, "workflow", str(workflow_id), "--json", "--dsn", dsn)
    assert len(json.loads(out)["jobs"]) == 1001


def test_the_newest_workflows_with_their_progress(conn, dsn, capsys, diamond):
    older = diamond[0]
    wf = Workflow()
    wf.add("one", queue="c")
    newer = wf.enqueue(conn)
    finish(conn, "c")
    code, out, _ = cli(capsys, "workflow", "--dsn", dsn)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert re.fullmatch(rf"workflow {newer}: 1 of 1 done; created \S+ {TIME}\S*, finished", lines[0]), lines[0]
    assert re.fullmatch(
        rf"workflow {older} \(nightly\): 1 of 4 done, 1 running, 1 queued, 1 waiting; created \S+ {TIME}\S*, running",
        lines[1],
    ), lines[1]
    code, out, _ = cli(capsys, "workflow", "--limit", "1", "--json", "--dsn", dsn)
    [listed] = json.loads(out)
    assert (listed["id"], listed["total"], listed["done"], listed["finished_at"]) == (newer, 1, 1, None)
    # and its finished time, in the tree's header, is its last job's
    code, out, _ = cli(capsys, "workflow", str(newer), "--dsn", dsn)
    assert re.search(r", finished \S+ \S+$", out.splitlines()[0]), out


def test_no_workflows(dsn, capsys):
    assert cli(capsys, "workflow", "--dsn", dsn)[:2] == (0, "no workflows\n")


# --- jobsup enqueue --after --------------------------------------------------------------------------


def test_enqueue_after_waits_for_its_parents(conn, dsn, capsys):
    a, b, c = (jobsup.enqueue(conn, "parent") for _ in range(3))
    code, out, _ = cli(capsys, "enqueue", "child", "--after", f"{a},{b}", "--after", str(c), "--dsn", dsn)
    assert code == 0
    child = int(re.fullmatch(rf"enqueued job (\d+), after {a}, {b}, {c}\n", out).group(1))
    assert row(conn, child)["status"] == "waiting" and row(conn, child)["parents_left"] == 3
    edges = conn.execute(
        "SELECT parent_id, on_parent_failure FROM jobsup.dependencies WHERE child_id = %s ORDER BY 1", (child,)
    ).fetchall()
    assert edges == [(a, "cancel"), (b, "cancel"), (c, "cancel")]

    code, out, _ = cli(
        capsys, "enqueue", "late", "--after", str(a), "--on-parent-failure", "run", "--json", "--dsn", dsn
    )
    late = json.loads(out)["id"]
    assert conn.execute(
        "SELECT on_parent_failure FROM jobsup.dependencies WHERE child_id = %s", (late,)
    ).fetchone() == ("run",)


def test_enqueue_file_lines_take_after(conn, dsn, capsys, tmp_path):
    parent = jobsup.enqueue(conn, "parent")
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(
        json.dumps({"kind": "x", "after": [parent]})
        + "\n"
        + json.dumps({"kind": "y", "after": [parent], "on_parent_failure": "run"})
        + "\n"
        + json.dumps({"kind": "z"})
        + "\n"
    )
    code, out, err = cli(capsys, "enqueue", "--file", str(lines), "--json", "--dsn", dsn)
    assert code == 0, err
    assert json.loads(out)["enqueued"] == 3
    got = conn.execute(
        "SELECT j.kind, j.status, e.on_parent_failure FROM jobsup.jobs j "
        "LEFT JOIN jobsup.dependencies e ON e.child_id = j.id WHERE j.id > %s ORDER BY j.id",
        (parent,),
    ).fetchall()
    assert got == [("x", "waiting", "cancel"), ("y", "waiting", "run"), ("z", "queued", None)]


@pytest.mark.slow  # the CLI in subprocesses, side by side
def test_enqueue_after_refuses_what_is_not_a_job_and_writes_nothing(conn, dsn, tmp_path):
    parent = jobsup.enqueue(conn, "parent")
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text(
        json.dumps({"kind": "ok", "after": [parent]}) + "\n" + json.dumps({"kind": "x", "after": [999999]})
    )
    before = jobs_count(conn)
    refused_all(
        dsn,
        [
            (
                ["enqueue", "child", "--after", "abc"],
                "argument --after: a job id is a whole number from 1 up, not 'abc'",
            ),
            (["enqueue", "child", "--after", f"{parent},0"], "not '0'"),
            (["enqueue", "child", "--after", f"{parent},999999"], "no job 999999"),
            (["enqueue", "child", "--on-parent-failure", "run"], "give the parents with --after"),
            (["enqueue", "child", "--after", str(parent), "--on-parent-failure", "maybe"], "invalid choice: 'maybe'"),
            (["enqueue", "--file", str(bad_line)], "no job 999999"),
        ],
    )
    assert jobs_count(conn) == before
    assert conn.execute("SELECT count(*) FROM jobsup.dependencies").fetchone() == (0,)


# --- jobsup cancel ---------------------------------------------------------------------------------------


def test_cancel_of_a_waiting_job_cancels_it_and_those_that_wait_for_it(conn, dsn, capsys):
    parent = jobsup.enqueue(conn, "parent")
    waiting = jobsup.enqueue(conn, "step", after=[parent])
    grandchild = jobsup.enqueue(conn, "step", after=[waiting])
    anyway = jobsup.enqueue(conn, "cleanup", after=[waiting], on_parent_failure="run")
    code, out, _ = cli(capsys, "cancel", "--id", str(waiting), "--dsn", dsn)
    assert code == 0
    assert out.splitlines() == [
        f"job {waiting} (step): cancelled (was waiting)",
        f"job {grandchild} (step): cancelled: job {waiting}, which it waits for, ended cancelled",
        f"job {anyway} (cleanup): queued: it waited for job {waiting} with on_parent_failure run",
        "cancelled 1 job (1 waiting, 0 queued); cancel requested for 0 running; 0 not changed; 1 more cancelled "
        "with them (they waited for a job cancelled here); 1 job released to run (on_parent_failure run)",
    ]
    assert statuses(conn, [parent, waiting, grandchild, anyway]) == ["queued", "cancelled", "cancelled", "queued"]
    w = row(conn, waiting)
    assert w["last_error"] == f"cancelled by {w['cancelled_by']}" and w["done_at"] is not None
    assert cancelled_total(conn, "step") == 2  # the command's and the cascade's


def test_cancel_workflow_cancels_waiting_and_queued_and_requests_running(conn, dsn, capsys):
    wf = Workflow("doomed")
    fetch = wf.add("fetch", queue="a")
    split = wf.add("split", after=fetch, queue="b")
    loads = [wf.add("load", after=fetch) for _ in range(2)]
    report = wf.add("report", after=[split, *loads])
    workflow_id = wf.enqueue(conn)
    finish(conn, "a")
    running = run_one(conn, "b").id
    outside = jobsup.enqueue(conn, "notify", after=[report.id])  # in no workflow: the cascade reaches it
    other = Workflow()
    bystander = other.add("bystander")
    other.enqueue(conn)

    code, out, _ = cli(capsys, "cancel", "--workflow", str(workflow_id), "--json", "--dsn", dsn)
    assert code == 0
    answer = json.loads(out)
    counts = {k: answer[k] for k in ("cancelled", "requested", "unchanged", "cascaded", "released")}
    assert counts == {"cancelled": 3, "requested": 1, "unchanged": 0, "cascaded": 1, "released": 0}
    assert [(j["id"], j["action"], j["was"], j["status"]) for j in answer["jobs"]] == [
        (running, "requested", "running", "running"),
        (loads[0].id, "cancelled", "queued", "cancelled"),
        (loads[1].id, "cancelled", "queued", "cancelled"),
        (report.id, "cancelled", "waiting", "cancelled"),
        (outside, "cascaded", "waiting", "cancelled"),
    ]
    assert statuses(conn, [fetch.id, running, loads[0].id, report.id, outside, bystander.id]) == [
        "done",
        "running",
        "cancelled",
        "cancelled",
        "cancelled",
        "queued",
    ]
    assert row(conn, running)["cancelled_by"].count("@") == 1  # the request its supervisor acts on
    assert row(conn, outside)["cancelled_by"] == "workflow"
    totals = {k: cancelled_total(conn, k) for k in ("load", "report", "notify", "split")}
    assert totals == {"load": 2, "report": 1, "notify": 1, "split": 0}

    code, out, _ = cli(capsys, "cancel", "--workflow", str(workflow_id), "--dsn", dsn)
    assert out == (
        f"workflow {workflow_id} has no job left to cancel (none waiting, queued, or running without a request)\n"
    )


def test_cancel_workflow_in_text_counts_what_it_did(conn, dsn, capsys):
    wf = Workflow()
    first = wf.add("fetch")
    wf.group([{"kind": "load"}] * 3, after=first)
    workflow_id = wf.enqueue(conn)
    code, out, _ = cli(capsys, "cancel", "--workflow", str(workflow_id), "--dsn", dsn)
    assert code == 0
    assert out.splitlines()[-1] == (
        f"workflow {workflow_id}: cancelled 4 jobs (3 waiting, 1 queued); cancel requested for 0 running"
    )


@pytest.mark.slow  # the CLI in subprocesses, side by side
def test_cancel_workflow_refusals(conn, dsn):
    wf = Workflow()
    wf.add("x")
    workflow_id = wf.enqueue(conn)
    refused_all(
        dsn,
        [
            (["cancel", "--workflow", "999999"], "no workflow 999999; nothing was changed"),
            (["cancel", "--workflow", "abc"], "a workflow id is a whole number from 1 up, not 'abc'"),
            (["cancel", "--workflow", str(workflow_id), "--kind", "x"], "cancel needs one of --id N ..., --kind K or"),
            (
                ["cancel", "--workflow", str(workflow_id), "--queue", "q"],
                "with --workflow the workflow says which jobs",
            ),
        ],
    )
    assert statuses(conn, [wf.refs[0].id]) == ["queued"]


# --- jobsup explain --------------------------------------------------------------------------------------


def test_explain_names_the_parents_a_job_waits_for(conn, dsn, capsys):
    parents = [jobsup.enqueue(conn, "parent", queue="p" if n == 0 else "default") for n in range(13)]
    child = jobsup.enqueue(conn, "child", after=parents)
    finish(conn, "p")
    code, out, _ = cli(capsys, "explain", str(child), "--dsn", dsn)
    assert code == 0
    shown = ", ".join(map(str, parents[1:11]))
    assert out == f"job {child} (child, waiting): waiting for 12 of 13 parents: ids {shown}, …\n"
    code, out, _ = cli(capsys, "explain", str(child), "--json", "--dsn", dsn)
    answer = json.loads(out)
    assert (answer["reason"], answer["details"]["parents"], answer["details"]["parents_left"]) == ("waiting", 13, 12)
    assert answer["details"]["waiting_for"][0] == {"id": parents[1], "kind": "parent", "status": "queued"}
    assert len(answer["details"]["waiting_for"]) == 10

    one = jobsup.enqueue(conn, "child", after=[parents[0], parents[1]])
    code, out, _ = cli(capsys, "explain", str(one), "--dsn", dsn)
    assert out == f"job {one} (child, waiting): waiting for 1 of 2 parents: id {parents[1]} (parent, queued)\n"


def test_explain_of_a_job_its_parents_failure_cancelled(conn, dsn, capsys):
    parent = jobsup.enqueue(conn, "parent", max_attempts=1)
    child = jobsup.enqueue(conn, "child", after=[parent])
    job = run_one(conn, "default")
    lifecycle.fail(conn, [Failure(job.id, job.attempts, "disk full")], SUP)
    code, out, _ = cli(capsys, "explain", str(child), "--dsn", dsn)
    assert code == 0
    assert re.fullmatch(
        rf"job {child} \(child, cancelled\): cancelled at \S+ {TIME}\S* \(\S+ ago\): job {parent}, which it waits for, "
        r"ended dead\n",
        out,
    ), out


@pytest.mark.slow  # the CLI in subprocesses
def test_the_real_command_refuses_an_unknown_workflow_and_what_is_no_id(dsn):
    result = jobsup_cli("workflow", "424242", "--dsn", dsn)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", "jobsup: error: no workflow 424242\n")
    refused_all(
        dsn,
        [
            (["workflow", "abc"], "argument ID: a workflow id is a whole number from 1 up, not 'abc'"),
            (["workflow", "0"], "not '0'"),
            (["workflow", "1", "--limit", "3"], "--limit counts the workflows listed without an ID"),
            (["workflow", "--limit", "0"], "argument --limit: must be at least 1: 0"),
        ],
    )
