"""`jobsup explain ID`: each reason a job is where it is, read from a real PostgreSQL, in the order of
precedence the answer takes them; and the command's text, --json and refusals."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import datetime

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

import jobsup
from jobsup import client
from jobsup.cli import main
from jobsup.db import lifecycle
from jobsup.db.lifecycle import Failure, Snoozed
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import BadInput
from jobsup.ops import control
from jobsup.ops.explain import Explanation, aexplain_text, explain, explain_text
from jobsup.ops.limits import list_limits, set_limits
from jobsup.ops.metrics import limit_gauges
from jobsup.ops.snapshot import limited_kinds

from .apps import limited
from .helpers import ROOT, cli_env, wait_for

SUP = "host-a:100:aa"  # the fake supervisor's id, as a claim writes it to locked_by


def supervisor(
    conn: psycopg.Connection,
    *,
    id: str = SUP,
    queues: tuple[str, ...] = ("default",),
    kinds: tuple[str, ...] | None = None,
    age: float = 0.0,
    state: str = "running",
) -> None:
    """A supervisor's row as its heartbeat writes it, beaten `age` seconds ago."""
    conn.execute(
        "INSERT INTO jobsup.supervisors (id, host, pid, version, queues, kinds, procs, state, heartbeat_at) "
        "VALUES (%s, 'host-a', 100, '0', %s, %s, 2, %s, now() - make_interval(secs => %s))",
        [id, list(queues), None if kinds is None else list(kinds), state, age],
    )


def claim(conn: psycopg.Connection, limit: int = 1, by: str = SUP) -> list[jobsup.Job]:
    return lifecycle.claim(conn, ["default"], limit, by, 30.0)


def claim_limited(conn: psycopg.Connection, kind: str, limit: int = 10) -> list[int]:
    jobs, _wake = lifecycle.claim_limited(conn, [kind], ["default"], limit, SUP, 30.0)
    return sorted(j.id for j in jobs)


def is_future(text: str | None, conn: psycopg.Connection) -> bool:
    assert text is not None
    return datetime.fromisoformat(text) > conn.execute("SELECT now()").fetchone()[0]


# --- finished --------------------------------------------------------------------------------------


def test_done(conn):
    job_id = jobsup.enqueue(conn, "email")
    [job] = claim(conn)
    lifecycle.complete(conn, [(job.id, job.attempts)], SUP)
    answer = explain(conn, job_id)
    assert (answer.reason, answer.status, answer.kind) == ("done", "done", "email")
    assert answer.text.startswith("done at ") and answer.text.endswith("on attempt 1 of 3"), answer.text


def test_dead_names_its_last_error(conn):
    job_id = jobsup.enqueue(conn, "email", max_attempts=1)
    [job] = claim(conn)
    lifecycle.fail(conn, [Failure(job.id, job.attempts, "SMTP said no")], SUP)
    answer = explain(conn, job_id)
    assert answer.reason == "dead"
    assert "after attempt 1 of 1 failed: SMTP said no" in answer.text, answer.text
    assert answer.details["last_error"] == "SMTP said no"


def test_cancelled_names_who(conn):
    job_id = jobsup.enqueue(conn, "email")
    control.cancel(conn, ids=[job_id], by="ann@ops")
    answer = explain(conn, job_id)
    assert answer.reason == "cancelled"
    assert answer.text.startswith("cancelled by ann@ops at "), answer.text
    assert answer.details["cancelled_by"] == "ann@ops"


# --- running ---------------------------------------------------------------------------------------


def test_running_names_its_supervisor_and_attempt(conn):
    supervisor(conn)
    job_id = jobsup.enqueue(conn, "email", max_attempts=5)
    claim(conn)
    answer = explain(conn, job_id)
    assert answer.reason == "running"
    assert answer.text.startswith(f"running on supervisor {SUP} since "), answer.text
    assert answer.text.endswith("(attempt 1 of 5)"), answer.text  # one line: its supervisor is alive
    assert answer.details["supervisor_live"] is True


def test_a_job_handed_out_behind_another_says_so_not_running(conn):
    """A short job handed to a worker behind another holds its running row (a limit counts it), but it
    has not started: its supervisor's heartbeat names it behind the worker's job, and explain says so."""
    supervisor(conn)
    first, second = jobsup.enqueue(conn, "email"), jobsup.enqueue(conn, "email")
    claim(conn, 2)
    worker = {"slot": 0, "pid": 4242, "state": "busy", "job_id": first, "kind": "email", "behind": [second]}
    conn.execute("UPDATE jobsup.supervisors SET workers = %s WHERE id = %s", [Jsonb([worker]), SUP])
    answer = explain(conn, second)
    assert answer.text.startswith(f"handed to a worker of supervisor {SUP} (pid 4242), waiting behind job {first}")
    assert answer.details["waiting_behind"] == first
    assert explain(conn, first).text.startswith(f"running on supervisor {SUP} since")


def test_running_under_a_silent_supervisor_says_the_reaper_returns_it(conn):
    supervisor(conn, age=120)
    job_id = jobsup.enqueue(conn, "email")
    claim(conn)
    answer = explain(conn, job_id)
    assert answer.reason == "running"
    first, second = answer.text.splitlines()
    assert "the reaper returns the job when its lease expires" in second, answer.text


# --- not due yet -----------------------------------------------------------------------------------


def test_scheduled(conn):
    supervisor(conn)
    job_id = jobsup.enqueue(conn, "email", delay=3600)
    answer = explain(conn, job_id)
    assert answer.reason == "scheduled"
    assert answer.text.startswith("scheduled for ") and "(in 59m" in answer.text, answer.text


def test_retry_names_the_failed_attempt_and_its_error(conn):
    supervisor(conn)
    job_id = jobsup.enqueue(conn, "email")
    [job] = claim(conn)
    lifecycle.fail(conn, [Failure(job.id, job.attempts, "timeout talking to SMTP", delay=600)], SUP)
    answer = explain(conn, job_id)
    assert answer.reason == "retry"
    assert answer.text.startswith("waiting for its retry until "), answer.text
    assert answer.text.endswith("after attempt 1 of 3 failed: timeout talking to SMTP"), answer.text


def test_a_snoozed_job_is_not_said_to_wait_for_a_retry(conn):
    supervisor(conn)
    job_id = jobsup.enqueue(conn, "email")
    [job] = claim(conn)
    lifecycle.fail(conn, [Failure(job.id, job.attempts, "first try failed", delay=0)], SUP)
    [job] = claim(conn)
    lifecycle.snooze(conn, [Snoozed(job.id, job.attempts, 600, "mailbox busy")], SUP)
    answer = explain(conn, job_id)
    assert answer.reason == "scheduled"  # attempts is 1 (the failure's), but a snooze is no retry
    assert answer.text.startswith("snoozed by its handler until ") and answer.text.endswith(": mailbox busy")


# --- paused ----------------------------------------------------------------------------------------


def test_paused_names_who_and_since_when(conn):
    supervisor(conn)
    job_id = jobsup.enqueue(conn, "email")
    control.pause(conn, "default", by="bob@ops")
    answer = explain(conn, job_id)
    assert answer.reason == "paused"
    assert answer.text.startswith("its queue default is paused, by bob@ops, since "), answer.text


def test_a_future_job_in_a_paused_queue_is_scheduled_first(conn):
    job_id = jobsup.enqueue(conn, "email", delay=3600)
    control.pause(conn, "default", by="bob@ops")
    assert explain(conn, job_id).reason == "scheduled"


# --- limits ----------------------------------------------------------------------------------------


def test_concurrency_names_the_holders(conn):
    supervisor(conn)
    set_limits(conn, "charge", "test", concurrency=2)
    ids = [jobsup.enqueue(conn, "charge") for _ in range(3)]
    held = claim_limited(conn, "charge")
    assert held == ids[:2]
    answer = explain(conn, ids[2])
    assert answer.reason == "concurrency"
    assert answer.text == (f"its kind charge is at its concurrency limit, 2 of 2, held by jobs {held[0]}, {held[1]}"), (
        answer.text
    )
    assert answer.details | {"limit": 2, "held": 2, "holders": held} == answer.details


def test_concurrency_lists_ten_holders_and_counts_the_rest(conn):
    supervisor(conn)
    set_limits(conn, "charge", "test", concurrency=12)
    ids = [jobsup.enqueue(conn, "charge") for _ in range(13)]
    held = claim_limited(conn, "charge", limit=20)
    assert len(held) == 12
    answer = explain(conn, ids[-1])
    assert answer.reason == "concurrency"
    assert answer.text.endswith(f"held by jobs {', '.join(map(str, held[:10]))} and 2 more"), answer.text


def test_a_paused_queue_comes_before_a_limit(conn):
    set_limits(conn, "charge", "test", concurrency=1)
    ids = [jobsup.enqueue(conn, "charge") for _ in range(2)]
    claim_limited(conn, "charge")
    control.pause(conn, "default", by="bob@ops")
    assert explain(conn, ids[1]).reason == "paused"


def test_key_concurrency_names_the_key_and_its_holder(conn):
    supervisor(conn)
    set_limits(conn, "charge", "test", key_concurrency=1)
    first = jobsup.enqueue(conn, "charge", key="account-42")
    second = jobsup.enqueue(conn, "charge", key="account-42")
    other = jobsup.enqueue(conn, "charge", key="account-7")
    assert claim_limited(conn, "charge") == [first, other]  # one per key
    answer = explain(conn, second)
    assert answer.reason == "key_concurrency"
    assert answer.text == f"its key 'account-42' of kind charge is at its limit, 1 of 1, held by job {first}"


def test_rate_says_when_the_next_start_is_allowed(conn):
    supervisor(conn)
    set_limits(conn, "charge", "test", rate="10/m")
    ids = [jobsup.enqueue(conn, "charge") for _ in range(2)]
    assert claim_limited(conn, "charge") == ids[:1]  # a burst of 1: the next start 6 s later
    answer = explain(conn, ids[1])
    assert answer.reason == "rate"
    assert answer.text.startswith("the rate of kind charge (10/m) allows the next start at "), answer.text
    assert answer.details["rate"] == "10/m" and is_future(answer.details["next_start"], conn)


def test_key_rate_says_when_the_key_may_start_again(conn):
    supervisor(conn)
    set_limits(conn, "charge", "test", key_rate="1/h")
    first = jobsup.enqueue(conn, "charge", key="account-42")
    second = jobsup.enqueue(conn, "charge", key="account-42")
    assert claim_limited(conn, "charge") == [first]
    answer = explain(conn, second)
    assert answer.reason == "key_rate"
    assert answer.text.startswith(
        "the rate of its key 'account-42' of kind charge (1/h) allows the key's next start at "
    )
    assert "(in 59m" in answer.text, answer.text
    assert is_future(answer.details["next_start"], conn)


# --- supervisors -----------------------------------------------------------------------------------


def test_no_supervisor_at_all(conn):
    job_id = jobsup.enqueue(conn, "email")
    answer = explain(conn, job_id)
    assert answer.reason == "no_supervisor_queue"
    assert answer.text == "no live supervisor serves its queue default: none has beaten its heartbeat in the last 30s"


def test_no_supervisor_of_its_queue(conn):
    supervisor(conn, queues=("other",))
    supervisor(conn, id="host-a:101:bb", age=3600)  # serves the queue, but long silent: not live
    supervisor(conn, id="host-a:102:cc", state="stopping")  # stopping: claims nothing more
    job_id = jobsup.enqueue(conn, "email")
    answer = explain(conn, job_id)
    assert answer.reason == "no_supervisor_queue"
    assert answer.text == "no live supervisor serves its queue default (1 live supervisor serves other queues)"


def test_no_supervisor_that_runs_its_kind(conn):
    supervisor(conn, kinds=("b", "a"))
    job_id = jobsup.enqueue(conn, "c")
    answer = explain(conn, job_id)
    assert answer.reason == "no_supervisor_kind"
    assert answer.text == "live supervisors serve its queue default, but none can run its kind c (they run a, b)"


def test_a_limited_job_whose_supervisors_cannot_run_it(conn):
    supervisor(conn, kinds=("email",))
    set_limits(conn, "charge", "test", concurrency=5)
    job_id = jobsup.enqueue(conn, "charge")
    assert explain(conn, job_id).reason == "no_supervisor_kind"


# --- ready -----------------------------------------------------------------------------------------


def test_ready(conn):
    supervisor(conn)  # kinds NULL: any kind
    job_id = jobsup.enqueue(conn, "email")
    answer = explain(conn, job_id)
    assert (answer.reason, answer.text) == ("ready", "ready: it should start within the poll")
    assert explain_text(conn, job_id) == answer.text


def test_the_console_form_gives_the_same_answer(dsn, conn):
    supervisor(conn)
    set_limits(conn, "charge", "test", concurrency=1)
    held, throttled = (jobsup.enqueue(conn, "charge") for _ in range(2))
    claim_limited(conn, "charge")

    async def read() -> str:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return await aexplain_text(aconn, throttled)

    said = asyncio.run(read())
    assert said == explain_text(conn, throttled) and f"held by job {held}" in said, said


def test_ready_within_its_limits(conn):
    supervisor(conn, kinds=("charge",))
    set_limits(conn, "charge", "test", concurrency=2, rate="100/m", key_concurrency=1, key_rate="10/m")
    ids = [jobsup.enqueue(conn, "charge", key="account-42") for _ in range(2)]
    answer = explain(conn, ids[0])
    assert answer.reason == "ready"
    assert answer.text == "ready: it should start within the poll; its limits allow a start now"


# --- unknown ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize("job_id", [999_999, 0, -1, 2**63])
def test_an_unknown_id_is_bad_input(conn, job_id):
    with pytest.raises(BadInput, match=f"no job with id {job_id}"):
        explain(conn, job_id)


# --- the command -----------------------------------------------------------------------------------


def test_the_command_prints_the_answer(dsn, conn, capsys):
    job_id = jobsup.enqueue(conn, "email", delay=3600)
    assert main(["explain", str(job_id), "--dsn", dsn]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"job {job_id} (email, queued): scheduled for "), out


def test_the_command_prints_json(dsn, conn, capsys):
    set_limits(conn, "charge", "test", concurrency=1)
    held, throttled = (jobsup.enqueue(conn, "charge") for _ in range(2))
    claim_limited(conn, "charge")
    assert main(["explain", str(throttled), "--json", "--dsn", dsn]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer == Explanation(**answer).to_json()
    assert (answer["id"], answer["kind"], answer["status"], answer["reason"]) == (
        throttled,
        "charge",
        "queued",
        "concurrency",
    )
    assert answer["details"]["holders"] == [held] and answer["details"]["queue"] == "default"


def test_the_command_shows_what_middleware_stored_with_the_job_and_its_trace(dsn, conn, capsys):
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    job_id = jobsup.enqueue(conn, "email", meta={"tenant": "acme", "traceparent": parent})
    plain = jobsup.enqueue(conn, "email")
    assert main(["explain", str(job_id), "--dsn", dsn]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [
        f'  meta: {{"tenant":"acme","traceparent":"{parent}"}}',
        "  trace: 4bf92f3577b34da6a3ce929d0e0e4736",
    ]
    assert main(["explain", str(job_id), "--json", "--dsn", dsn]) == 0
    details = json.loads(capsys.readouterr().out)["details"]
    assert details["meta"]["tenant"] == "acme" and details["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert main(["explain", str(plain), "--dsn", dsn]) == 0
    assert "meta" not in capsys.readouterr().out


def test_the_command_refuses_an_unknown_id(dsn, capsys):
    assert main(["explain", "424242", "--dsn", dsn]) == 2
    assert capsys.readouterr().err == "jobsup: error: no job with id 424242\n"


@pytest.mark.parametrize("given", ["abc", "1.5", "0", "-3"])
def test_the_command_refuses_what_is_not_a_job_id(given, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["explain", "--dsn", "postgresql://never.invalid/x", "--", given])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err == f"jobsup explain: error: argument ID: a job id is a whole number from 1 up, not {given!r}\n"


@pytest.mark.slow  # the CLI in subprocesses
def test_the_real_command_exits_2_with_one_line(dsn):
    for args in (["explain", "abc"], ["explain", "424242"]):
        result = subprocess.run(
            [sys.executable, "-m", "jobsup", *args, "--dsn", dsn],
            cwd=ROOT,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


# --- ready, and every worker busy: a real supervisor ---------------------------------------------------


@pytest.mark.slow
def test_ready_jobs_behind_busy_workers_are_startable_not_throttled_everywhere(conn, dsn, start):
    """2 workers busy on long jobs of a kind limited to 50 at once, 4 more ready: the limit holds none
    of them back. `explain`, `jobsup limit`, `jobsup stats`, the console and the metrics say they wait
    for a worker (startable), not for a limit (throttled); once the limit is what holds them, all say so."""
    conn.execute(limited.SCHEMA)
    sup = start("--prefetch", "0", app="tests.apps.limited:app", procs=2, env={"JOBSUP_LIMITS_DSN": dsn})
    declared = "SELECT count(*) FROM jobsup.limits WHERE kind = 'wide' AND limited"
    wait_for(lambda: conn.execute(declared).fetchone()[0], 30, message=f"the limit declared\n{sup.log()}")
    *_, last = client.enqueue_many(conn, [{"kind": "wide", "payload": {"seconds": 60}}] * 6)
    said = wait_for(
        lambda: (e := explain(conn, last)).reason == "workers_busy" and e, 30, 0.05, f"busy workers\n{sup.log()}"
    )
    assert said.text == (
        "ready, waiting for a free worker: the 2 workers of the live supervisors that run it were busy at "
        "their last heartbeat; its limits allow a start now"
    )
    assert (said.details["workers"], said.details["busy_workers"]) == (2, 2)
    assert counts(conn) == {"held": 2, "throttled": 0, "startable": 4}

    set_limits(conn, "wide", "test", concurrency=2)  # now the limit holds them: 2 of 2
    assert explain(conn, last).reason == "concurrency"
    assert counts(conn) == {"held": 2, "throttled": 4, "startable": 0}


def counts(conn: psycopg.Connection) -> dict[str, int]:
    """The kind `wide`'s figures as each reader has them, checked to agree: `jobsup limit --json`,
    `jobsup stats --json` (the console's and `jobsup check`'s row) and the exporter's gauges."""
    [listed] = [r for r in list_limits(conn) if r["kind"] == "wide"]
    with conn.cursor(row_factory=dict_row) as cur:
        [kind] = [k for k in limited_kinds(cur.execute(SQL["limited_kinds"], {"counted": 10_001})) if k.kind == "wide"]
    gauges = {m.name: {s.labels["kind"]: s.value for s in m.samples} for m in limit_gauges([kind])}
    figures = {"held": listed["held"], "throttled": listed["throttled"], "startable": listed["startable"]}
    assert figures == {"held": kind.held, "throttled": kind.throttled, "startable": kind.startable}
    assert gauges["jobsup_limit_throttled_jobs"]["wide"] == kind.throttled
    assert gauges["jobsup_limit_startable_jobs"]["wide"] == kind.startable
    return figures
