"""The `jobsup` command in a subprocess against a real PostgreSQL: enqueue, --file, stats, requeue-dead."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest

from jobsup import client
from jobsup.cli.enqueue import ENQUEUE_CHUNK
from jobsup.db import lifecycle
from jobsup.db.lifecycle import Failure
from jobsup.ops.snapshot import rows

from .helpers import ROOT, cli_env, jobsup, refused_all

pytestmark = pytest.mark.slow  # every test runs the CLI in subprocesses, most of them many times


def run(dsn: str, *args: str, input: str | None = None, **env: str):
    return jobsup(*args, "--dsn", dsn, input=input, env=cli_env(**env) if env else None)


def ok(dsn: str, *args: str, input: str | None = None, **env: str) -> str:
    result = run(dsn, *args, input=input, **env)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


def refused(dsn: str, *args: str, input: str | None = None, code: int = 2, **env: str) -> str:
    """Run a command that must be refused: the exit code, one line on stderr, no traceback."""
    result = run(dsn, *args, input=input, **env)
    assert result.returncode == code, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, (args, result.stderr)
    return lines[0]


def enqueued_id(stdout: str) -> int:
    assert stdout.startswith("enqueued job "), stdout
    return int(stdout.split()[-1])


def jobs(conn: psycopg.Connection) -> list[dict]:
    return [rows(conn, "job", id=r[0])[0] for r in conn.execute("SELECT id FROM jobsup.jobs ORDER BY id")]


# --- enqueue KIND JSON -----------------------------------------------------------------------------


def test_enqueue_with_each_option(dsn, conn):
    row = rows(conn, "job", id=enqueued_id(ok(dsn, "enqueue", "email", '{"to": "a@example.com"}')))[0]
    assert (row["kind"], row["payload"], row["queue"], row["priority"], row["max_attempts"]) == (
        "email",
        {"to": "a@example.com"},
        "default",
        0,
        3,
    )
    assert row["run_at"] == row["created_at"]

    assert rows(conn, "job", id=enqueued_id(ok(dsn, "enqueue", "ping")))[0]["payload"] == {}

    job_id = enqueued_id(
        ok(
            dsn,
            "enqueue",
            "report",
            '{"ids": [1, 2]}',
            "--queue",
            "slow",
            "--priority",
            "-3",
            "--max-attempts",
            "7",
            "--unique-key",
            "r-1",
        )
    )
    row = rows(conn, "job", id=job_id)[0]
    assert (row["payload"], row["queue"], row["priority"], row["max_attempts"], row["unique_key"]) == (
        {"ids": [1, 2]},
        "slow",
        -3,
        7,
        "r-1",
    )
    out = ok(dsn, "enqueue", "report", "--unique-key", "r-1")
    assert out.strip() == "skipped: a job with unique key 'r-1' is already queued or running"

    row = rows(conn, "job", id=enqueued_id(ok(dsn, "enqueue", "later", "--delay", "400ms")))[0]
    assert row["run_at"] - row["created_at"] == timedelta(milliseconds=400)
    row = rows(conn, "job", id=enqueued_id(ok(dsn, "enqueue", "later", "--delay", "5m")))[0]
    assert row["run_at"] - row["created_at"] == timedelta(minutes=5)

    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    row = rows(conn, "job", id=enqueued_id(ok(dsn, "enqueue", "at", "--run-at", when.isoformat())))[0]
    assert row["run_at"] == when
    row = rows(
        conn, "job", id=enqueued_id(ok(dsn, "enqueue", "at", "--run-at", "2030-01-02T03:04:05Z", "--delay", "1s"))
    )[0]
    assert row["run_at"] == datetime(2030, 1, 2, 3, 4, 6, tzinfo=UTC)
    assert len(jobs(conn)) == 7


def test_enqueue_refuses_bad_input(dsn, conn):
    refused_all(
        dsn,
        [
            (["enqueue", *args], says)
            for args, says in [
                (["email", "{nope"], "payload is not JSON"),
                (["email", '{"a": NaN}'], "not JSON"),
                (["email", '{"a": "\\u0000"}'], "NUL"),
                (["", "{}"], "needs a KIND"),
                (["   "], "kind"),
                ([], "needs a KIND"),
                (["email", "--priority", "high"], "not a whole number"),
                (["email", "--priority", "99999999999"], ("--priority", "must be from -2147483648 to 2147483647")),
                (["email", "--priority", "-2147483649"], "must be from -2147483648 to 2147483647"),
                (["email", "--max-attempts", "99999999999"], ("--max-attempts", "must be from 1 to 2147483647")),
                (["email", "--delay", "soon"], "not a duration"),
                (["email", "--delay", "-5"], "must be 0 or more"),
                (["email", "--max-attempts", "0"], "must be at least 1"),
                (["email", "--max-attempts", "two"], "not a whole number"),
                (["email", "--run-at", "tomorrow"], "not an ISO time"),
                (["email", "--bogus"], "unrecognized arguments: --bogus"),
                (["email", "{}", "extra"], "unrecognized arguments: extra"),
                (["email", "--file", "jobs.jsonl"], "not both"),
            ]
        ],
    )
    assert jobs(conn) == []


def test_enqueue_refuses_a_payload_over_the_limit(dsn, conn, tmp_path):
    line = refused(dsn, "enqueue", "big", json.dumps({"data": "x" * 200}), JOBSUP_MAX_PAYLOAD="100")
    assert "over the limit of 100" in line and "JOBSUP_MAX_PAYLOAD" in line
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"kind": "small"}\n' + json.dumps({"kind": "big", "payload": {"data": "x" * 200}}) + "\n")
    line = refused(dsn, "enqueue", "--file", str(path), JOBSUP_MAX_PAYLOAD="100")
    assert line.startswith("jobsup: error: line 2:") and "over the limit of 100" in line
    assert jobs(conn) == []
    assert enqueued_id(ok(dsn, "enqueue", "fits", json.dumps({"data": "x" * 80}), JOBSUP_MAX_PAYLOAD="100"))


# --- enqueue --file --------------------------------------------------------------------------------


def test_enqueue_file_in_one_transaction(dsn, conn, tmp_path):
    n = ENQUEUE_CHUNK + 50  # more than one statement's worth
    lines = [json.dumps({"kind": "bulk", "payload": {"n": i}}) for i in range(n - 4)]
    lines += [
        json.dumps(
            {
                "kind": "rich",
                "payload": {"x": 1},
                "queue": "q2",
                "priority": 4,
                "delay": "400ms",
                "max_attempts": 6,
                "unique_key": "u1",
            }
        ),
        json.dumps({"kind": "rich", "unique_key": "u1"}),  # skipped: its key is taken a line earlier
        "",  # blank lines are ignored
        json.dumps({"kind": "rich", "run_at": "2030-01-02T03:04:05+00:00", "delay": 2}),
        json.dumps({"kind": "rich", "run_at": "2030-01-02T03:04:05Z"}),
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = ok(dsn, "enqueue", "--file", str(path))
    assert out.startswith(f"enqueued {n - 1} jobs in ") and "(1 skipped" in out
    total, transactions = conn.execute("SELECT count(*), count(DISTINCT xmin::text) FROM jobsup.jobs").fetchone()
    assert (total, transactions) == (n - 1, 1)
    ns = [r[0] for r in conn.execute("SELECT (payload->>'n')::int FROM jobsup.jobs WHERE kind = 'bulk' ORDER BY id")]
    assert ns == list(range(n - 4))  # in file order
    [rich, at, at_z] = [r for r in jobs(conn) if r["kind"] == "rich"]
    assert (rich["payload"], rich["queue"], rich["priority"], rich["max_attempts"], rich["unique_key"]) == (
        {"x": 1},
        "q2",
        4,
        6,
        "u1",
    )
    assert rich["run_at"] - rich["created_at"] == timedelta(milliseconds=400)
    assert at["run_at"] == datetime(2030, 1, 2, 3, 4, 7, tzinfo=UTC)
    assert at_z["run_at"] == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_enqueue_file_from_stdin(dsn, conn):
    lines = [
        '{"kind": "a"}',
        '{"kind": "b", "payload": {"n": [1]}}',
        # null means "not given", like a field left out
        '{"kind": "c", "payload": null, "queue": null, "delay": null, "run_at": null, "priority": null,'
        ' "max_attempts": null, "unique_key": null}',
    ]
    out = ok(dsn, "enqueue", "--file", "-", input="\n".join(lines) + "\n")
    assert out.startswith("enqueued 3 jobs")
    got = jobs(conn)
    assert [(r["kind"], r["payload"]) for r in got] == [("a", {}), ("b", {"n": [1]}), ("c", {})]
    assert (got[2]["queue"], got[2]["priority"], got[2]["max_attempts"], got[2]["unique_key"]) == (
        "default",
        0,
        3,
        None,
    )
    assert got[2]["run_at"] == got[2]["created_at"]


def test_enqueue_file_names_the_bad_line(dsn, conn, tmp_path):
    good = '{"kind": "fine"}\n\n{"kind": "fine", "payload": {"n": 2}}\n'
    cases = []
    for n, (bad, says) in enumerate(
        [
            ('{"kind": "x", "payload": {nope}}', "not JSON"),
            ('{"payload": {}}', 'needs a "kind"'),
            ('{"kind": "x", "colour": "red"}', "unknown field(s) colour"),
            ('{"kind": "x", "delay": "soon"}', "not a duration"),
            ('{"kind": "x", "delay": -1}', "must be 0 or more"),
            ('{"kind": "x", "run_at": "someday"}', "not an ISO time"),
            ('{"kind": "x", "priority": "high"}', "priority"),
            ('{"kind": "x", "max_attempts": 0}', "max_attempts"),
            (
                '{"kind": "x", "max_attempts": 99999999999}',
                "max_attempts of a 'x' job must be a whole number from 1 to 2147483647",
            ),
            ('{"kind": "x", "priority": 99999999999}', "must be a whole number from -2147483648 to 2147483647"),
            ('{"kind": ""}', "kind"),
            ('["kind", "x"]', "expected a JSON object"),
            ('{"kind": null}', 'needs a "kind"'),
            ('{"kind": "x", "delay": [1]}', "delay must be"),
            ('{"kind": "x", "delay": true}', "delay must be"),
            ('{"kind": "x", "run_at": 1234567890}', "run_at must be an ISO time"),
            ('{"kind": "x", "payload": {"s": "\\u0000"}}', "NUL"),
        ]
    ):
        path = tmp_path / f"jobs{n}.jsonl"
        path.write_text(good + bad + '\n{"kind": "fine"}\n')
        cases.append((["enqueue", "--file", str(path)], ("jobsup: error: line 4: ", says)))
    refused_all(dsn, cases)
    assert jobs(conn) == []


def test_enqueue_file_unreadable(dsn, conn, tmp_path):
    assert "cannot read" in refused(dsn, "enqueue", "--file", str(tmp_path / "missing.jsonl"))
    assert "cannot read" in refused(dsn, "enqueue", "--file", str(tmp_path))  # a directory
    assert jobs(conn) == []


def test_enqueue_file_names_a_line_that_is_not_utf8_from_a_file_or_stdin(dsn, conn, tmp_path):
    data = '{"kind": "fine"}\n{"kind": "caf\xe9"}\n{"kind": "fine"}\n'.encode("latin-1")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(data)
    line = refused(dsn, "enqueue", "--file", str(path))
    assert line == "jobsup: error: line 2: not UTF-8 text (byte 0xe9 at column 14)", line
    result = subprocess.run(
        [sys.executable, "-m", "jobsup", "enqueue", "--file", "-", "--dsn", dsn],
        cwd=ROOT,
        env=cli_env(),
        input=data,
        capture_output=True,
    )
    assert result.returncode == 2, result
    assert result.stderr.decode().strip() == "jobsup: error: line 2: not UTF-8 text (byte 0xe9 at column 14)"
    assert jobs(conn) == []


def test_enqueue_file_takes_the_flags_as_defaults_of_the_lines_that_leave_a_field_out(dsn, conn, tmp_path):
    path = tmp_path / "jobs.jsonl"
    path.write_text(
        "\n".join(
            [
                '{"kind": "bare"}',
                '{"kind": "own", "queue": "mine", "priority": -1, "max_attempts": 2, "delay": 0}',
                '{"kind": "nulls", "queue": null, "priority": null}',  # null is "not given", so the flag's
            ]
        )
        + "\n"
    )
    out = ok(
        dsn,
        "enqueue",
        "--file",
        str(path),
        "--queue",
        "bigq",
        "--priority",
        "5",
        "--max-attempts",
        "9",
        "--delay",
        "1h",
    )
    assert out.startswith("enqueued 3 jobs in "), out
    bare, own, nulls = jobs(conn)
    assert (bare["queue"], bare["priority"], bare["max_attempts"]) == ("bigq", 5, 9)
    assert bare["run_at"] - bare["created_at"] == timedelta(hours=1)
    assert (own["queue"], own["priority"], own["max_attempts"]) == ("mine", -1, 2)
    assert own["run_at"] == own["created_at"]
    assert (nulls["queue"], nulls["priority"], nulls["max_attempts"]) == ("bigq", 5, 9)
    # --run-at too; one --unique-key for many lines would keep one of them, so it is refused
    when = "2030-01-02T03:04:05+00:00"
    path.write_text('{"kind": "at"}\n')
    ok(dsn, "enqueue", "--file", str(path), "--run-at", when)
    assert jobs(conn)[-1]["run_at"] == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    line = refused(dsn, "enqueue", "--file", str(path), "--unique-key", "k")
    assert "--unique-key names one job" in line
    assert len(jobs(conn)) == 4


def test_enqueue_says_one_job_and_json_tells_a_script_what_happened(dsn, conn, tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text('{"kind": "a", "unique_key": "k"}\n')
    assert ok(dsn, "enqueue", "--file", str(path)).startswith("enqueued 1 job in ")
    data = json.loads(ok(dsn, "enqueue", "--file", str(path), "--json"))
    assert (data["enqueued"], data["skipped"]) == (0, 1)
    data = json.loads(ok(dsn, "enqueue", "b", "--unique-key", "kb", "--json"))
    assert data == {"id": data["id"], "skipped": False} and isinstance(data["id"], int)
    # a skipped duplicate is exit 0 too: the job its key names exists
    assert json.loads(ok(dsn, "enqueue", "b", "--unique-key", "kb", "--json")) == {"id": None, "skipped": True}
    assert len(jobs(conn)) == 2


# --- bad input from the environment and odd flags -------------------------------------------------


def test_a_bad_max_payload_is_one_line_where_it_is_used_and_help_still_works(dsn, conn, tmp_path):
    for value in ("abc", "-1", "0"):
        result = jobsup("enqueue", "--help", env=cli_env(JOBSUP_MAX_PAYLOAD=value))
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        line = refused(dsn, "enqueue", "x", JOBSUP_MAX_PAYLOAD=value)
        assert (
            line == f"jobsup: error: JOBSUP_MAX_PAYLOAD must be a whole number of bytes, at least 1, not {value!r}"
        ), line
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"kind": "x"}\n')
    assert "JOBSUP_MAX_PAYLOAD" in refused(dsn, "enqueue", "--file", str(path), JOBSUP_MAX_PAYLOAD="abc")
    assert jobs(conn) == []


def test_a_data_dir_that_is_a_file_is_refused_in_one_line(tmp_path):
    for args in (
        ["stats", "--data-dir", "README.md"],
        ["db", "url", "--data-dir", "README.md"],
        ["stats", "--data-dir", "README.md/pgdata"],
    ):
        result = jobsup(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "README.md" in result.stderr and "not a directory" in result.stderr
    result = jobsup("stats", env=cli_env(JOBSUP_DATA_DIR=str(ROOT / "README.md")))
    assert result.returncode == 2 and "JOBSUP_DATA_DIR" in result.stderr, result.stderr


def test_start_names_a_dsn_that_does_not_parse_without_its_password():
    # the other commands: tests/test_dsn.py, BAD_DSNS
    result = jobsup(
        "start", "--app", "examples.misbehave:app", "--procs", "1", "--dsn", "postgresql//u:secretpw@127.0.0.1:1/x"
    )
    assert result.returncode == 2, result.stderr  # bad input: nothing was tried
    assert "not a valid DSN: 'postgresql//u:***@127.0.0.1:1/x'" in result.stderr, result.stderr
    assert "secretpw" not in result.stderr + result.stdout and "Traceback" not in result.stderr
    assert "worker.spawned" not in result.stderr + result.stdout  # refused before any worker starts


def test_an_app_of_the_wrong_form_is_refused_before_anything_starts(dsn, conn):
    # one line each: no worker.spawned before it
    refused_all(
        dsn,
        [
            (
                ["start", "--app", app],
                f"jobsup: error: --app must look like module:attribute (e.g. examples.lab:app), not {app!r}",
            )
            for app in ("examples.misbehave", "examples.misbehave:", ":app", "examples/misbehave.py:app", "a:b:c")
        ],
    )
    line = refused(dsn, "start", JOBSUP_APP="nocolon")
    assert "--app must look like module:attribute" in line
    assert conn.execute("SELECT count(*) FROM jobsup.supervisors").fetchone()[0] == 0


def test_db_refuses_a_dsn_it_would_ignore(dsn):
    for action in ("url", "start", "stop"):
        line = refused(dsn, "db", action)  # run() adds --dsn
        assert line.startswith(f"jobsup: error: jobsup db {action} manages the embedded PostgreSQL"), line
        assert "secret" not in line


def test_help_shows_the_value_a_variable_sets(tmp_path):
    # wide, so argparse does not wrap a path at its hyphens
    env = cli_env(JOBSUP_DATA_DIR=str(tmp_path / "pg"), JOBSUP_PROCS="3", JOBSUP_LEASE="7s", COLUMNS="500")
    text = jobsup("stats", "--help", env=env).stdout
    assert f"env JOBSUP_DATA_DIR, set to {tmp_path / 'pg'}; built-in default" in text, text
    text = jobsup("start", "--help", env=env).stdout
    assert "env JOBSUP_PROCS, set to 3; built-in default" in text and "env JOBSUP_LEASE, set to 7s" in text
    unset = {
        k: v for k, v in cli_env(COLUMNS="500").items() if k != "JOBSUP_DATA_DIR"
    }  # as the caller's shell may set it
    text = jobsup("stats", "--help", env=unset).stdout
    assert "(env JOBSUP_DATA_DIR; default " in text


# --- stats and requeue-dead ------------------------------------------------------------------------


def make_state(conn: psycopg.Connection) -> None:
    """email: 2 ready, 1 scheduled, 1 running, 1 done, 2 dead (3 failed attempts); sms: 1 ready."""
    attempts = [3, 3, 1, 1, 3, 3, 3]
    client.enqueue_many(conn, [{"kind": "email", "max_attempts": n} for n in attempts])
    client.enqueue(conn, "email", delay=3600)
    jobs_ = lifecycle.claim(conn, ["default"], 5, "sup-a", 30)
    assert [j.max_attempts for j in jobs_] == attempts[:5]
    lifecycle.complete(conn, [(jobs_[0].id, 1)], "sup-a")
    lifecycle.fail(conn, [Failure(jobs_[1].id, 1, "smtp down")], "sup-a", backoff_base=3600)  # scheduled again
    lifecycle.fail(conn, [Failure(jobs_[2].id, 1, "smtp down"), Failure(jobs_[3].id, 1, "bad address")], "sup-a")
    client.enqueue(conn, "sms", {"to": "+1"}, queue="texts")


def test_stats_json_matches_the_database(dsn, conn):
    make_state(conn)
    data = json.loads(ok(dsn, "stats", "--json"))
    by_kind = {k["kind"]: k for k in data["kinds"]}
    for kind in ("email", "sms"):
        ready, scheduled, running, dead = conn.execute(
            """SELECT count(*) FILTER (WHERE status = 'queued' AND run_at <= now()),
                      count(*) FILTER (WHERE status = 'queued' AND run_at > now()),
                      count(*) FILTER (WHERE status = 'running'),
                      count(*) FILTER (WHERE status = 'dead')
               FROM jobsup.jobs WHERE kind = %s""",
            (kind,),
        ).fetchone()
        done = conn.execute("SELECT count(*) FROM jobsup.jobs WHERE kind = %s AND status = 'done'", (kind,)).fetchone()[
            0
        ]
        failed = conn.execute(
            "SELECT coalesce(sum(jsonb_array_length(errors)), 0) FROM jobsup.jobs WHERE kind = %s", (kind,)
        ).fetchone()[0]
        row = by_kind[kind]
        assert (row["ready"], row["scheduled"], row["running"], row["done"], row["failed"], row["dead"]) == (
            ready,
            scheduled,
            running,
            done,
            failed,
            dead,
        )
    assert (
        by_kind["email"]["ready"],
        by_kind["email"]["scheduled"],
        by_kind["email"]["running"],
        by_kind["email"]["done"],
        by_kind["email"]["failed"],
        by_kind["email"]["dead"],
    ) == (2, 2, 1, 1, 3, 2)
    assert data["total"]["ready"] == 3 and data["total"]["dead"] == 2
    assert set(data["oldest_ready"]) == {"default", "texts"}
    assert sorted(j["last_error"] for j in data["dead_jobs"]) == ["bad address", "smtp down"]
    assert {(g["kind"], g["last_error"], g["count"]) for g in data["dead_groups"]} == {
        ("email", "smtp down", 1),
        ("email", "bad address", 1),
    }
    datetime.fromisoformat(data["taken_at"])
    datetime.fromisoformat(data["dead_jobs"][0]["done_at"])

    text = ok(dsn, "stats")
    assert "email" in text and "sms" in text and "smtp down" in text and "bad address" in text
    assert "dead jobs (newest 2 of 2)" in text


@pytest.mark.parametrize("columns", [80, 160])
def test_stats_cuts_no_word_of_the_counts_on_a_terminal_of_80_columns(dsn, conn, columns):
    # A job waiting for its parent adds the waiting column: nine counts, 87 columns with the box.
    parent = client.enqueue(conn, "segfault_reporter", delay=600)
    client.enqueue(conn, "segfault_reporter", after=[parent])
    text = ok(dsn, "stats", COLUMNS=str(columns))
    counts = text[: text.index("oldest ready job")]
    assert "…" not in counts and all(len(line) <= columns for line in text.splitlines()), text
    header = next(line for line in counts.splitlines() if "waiting" in line).split()
    words = ["kind", "waiting", "ready", "scheduled", "running", "done", "failed", "dead", "cancelled"]
    if columns == 80:  # without the box
        assert header == words, text
    else:
        assert header[1::2] == words and set(header[::2]) == {"┃"}, text
    assert "segfault_reporter" in counts


def test_stats_of_an_empty_queue(dsn):
    data = json.loads(ok(dsn, "stats", "--json"))
    assert data["kinds"] == [] and data["total"]["ready"] == 0 and data["dead_jobs"] == []
    assert "(no ready jobs)" in ok(dsn, "stats")


def test_requeue_dead(dsn, conn):
    make_state(conn)
    client.enqueue(conn, "sms", max_attempts=1, queue="texts2")
    [sms] = lifecycle.claim(conn, ["texts2"], 1, "sup-a", 30)
    lifecycle.fail(conn, [Failure(sms.id, 1, "no credit")], "sup-a")
    dead_email = [
        r[0] for r in conn.execute("SELECT id FROM jobsup.jobs WHERE kind = 'email' AND status = 'dead' ORDER BY id")
    ]
    assert len(dead_email) == 2

    assert ok(dsn, "requeue-dead", "--kind", "nothing").strip() == "requeued 0 dead jobs (kind nothing)"
    assert (
        ok(dsn, "requeue-dead", "--kind", "email", "--error", "smtp down").strip()
        == "requeued 1 dead job (kind email and error 'smtp down')"
    )
    assert ok(dsn, "requeue-dead", "--kind", "email").strip() == "requeued 1 dead job (kind email)"
    assert (
        conn.execute(
            "SELECT count(*) FROM jobsup.jobs WHERE id = ANY(%s) AND status = 'queued' AND attempts = 0", (dead_email,)
        ).fetchone()[0]
        == 2
    )
    assert json.loads(ok(dsn, "requeue-dead", "--id", str(sms.id), "--json")) == {"requeued": 1, "ids": [sms.id]}
    assert ok(dsn, "requeue-dead").strip() == "requeued 0 dead jobs"
    assert {r["kind"]: r["dead"] for r in rows(conn, "kind_totals")} == {"email": 0, "sms": 0}
    assert "at least 1" in refused(dsn, "requeue-dead", "--id", "0")


def test_requeue_dead_takes_ids_after_one_flag_or_each_after_its_own(dsn, conn):
    ids = client.enqueue_many(conn, [{"kind": "x", "max_attempts": 1}] * 4)
    claimed = lifecycle.claim(conn, ["default"], 4, "sup-a", 30)
    lifecycle.fail(conn, [Failure(j.id, 1, "boom") for j in claimed], "sup-a")
    assert (
        ok(dsn, "requeue-dead", "--id", str(ids[0]), str(ids[1])).strip()
        == f"requeued 2 dead jobs (ids {ids[0]}, {ids[1]})"
    )
    assert (
        ok(dsn, "requeue-dead", "--id", str(ids[2]), "--id", str(ids[3])).strip()
        == f"requeued 2 dead jobs (ids {ids[2]}, {ids[3]})"
    )
    assert "not a whole number" in refused(dsn, "requeue-dead", "--id", "2", "x")
    assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE status = 'queued'").fetchone()[0] == 4
