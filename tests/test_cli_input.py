"""Input the command line refuses in one line with exit 2 (a lease too short to be renewed, a time
without a zone, a negative duration, a DSN that does not parse), and the one line that says which
server lacks the schema when a command reaches the wrong one."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobsup.cli import main
from jobsup.cli.options import duration, iso_time
from jobsup.db import dsn as dsns
from jobsup.db.migrate import require_schema
from jobsup.durations import parse_duration
from jobsup.errors import EXIT_USAGE, BadInput, DatabaseUnavailable, SchemaMissing
from jobsup.supervisor.config import Config

from .helpers import ROOT, cli_env

SECRET = "hunter2"
APP = "examples.misbehave:app"


def run_all(cases: list[tuple[list[str], dict[str, str]]]) -> list[tuple[list[str], int, str, str]]:
    """Run every `jobsup ARGS` (with its extra environment) at once; (args, exit code, stdout, stderr)."""
    procs = [
        (
            args,
            subprocess.Popen(
                [sys.executable, "-m", "jobsup", *args],
                cwd=ROOT,
                env=cli_env(**env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for args, env in cases
    ]
    results = []
    for args, proc in procs:
        out, err = proc.communicate(timeout=180)  # many at once, on a loaded machine
        results.append((args, proc.returncode, out, err))
    return results


def one_line(args: list[str], err: str) -> str:
    assert "Traceback" not in err, (args, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, (args, err)
    return lines[0]


# --- the lease's floor -------------------------------------------------------------------------------


def test_a_lease_below_the_floor_is_refused_by_the_config():
    Config(app=APP, lease=0.3).validate()
    for lease in (0.001, 0.299, 0.0):
        with pytest.raises(BadInput) as caught:
            Config(app=APP, lease=lease).validate()
        assert "--lease must be at least 300ms" in str(caught.value), caught.value
        assert "renewed every third" in str(caught.value)


def test_start_help_names_the_lease_floor(capsys):
    with pytest.raises(SystemExit):
        main(["start", "--help"])
    assert "renewed every third of it; at least 300ms" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow  # the CLI in subprocesses
def test_start_refuses_a_lease_below_the_floor_before_anything_starts():
    dsn = f"postgresql://app:{SECRET}@127.0.0.1:1/app"  # never reached: the flags are refused first
    cases = [
        (["start", "--app", APP, "--procs", "1", "--dsn", dsn, "--lease", "1ms"], {}),
        (["start", "--app", APP, "--procs", "1", "--dsn", dsn, "--lease", "299ms"], {}),
        (["start", "--app", APP, "--procs", "1", "--dsn", dsn], {"JOBSUP_LEASE": "1ms"}),
    ]
    for args, code, out, err in run_all(cases):
        line = one_line(args, err)
        assert code == EXIT_USAGE, (args, code, err)
        assert line.startswith("jobsup: error: --lease must be at least 300ms"), line
        assert "worker.spawned" not in out + err


# --- a time without a zone ---------------------------------------------------------------------------


def test_iso_time_refuses_a_time_without_a_zone():
    assert iso_time("2030-01-01T00:00Z") == datetime(2030, 1, 1, tzinfo=UTC)
    assert iso_time("2030-01-01T01:00+01:00") == datetime(2030, 1, 1, tzinfo=UTC)
    for naive in ("2030-01-01T00:00", "2030-01-01"):
        with pytest.raises(argparse.ArgumentTypeError) as caught:
            iso_time(naive)
        message = str(caught.value)
        assert f"{naive!r} has no time zone" in message, message
        assert "2030-01-01T00:00+01:00" in message and "Z for UTC" in message


@pytest.mark.slow  # the CLI in subprocesses
def test_enqueue_refuses_a_run_at_without_a_zone(dsn, conn, tmp_path):
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"kind": "ok"}\n{"kind": "naive", "run_at": "2030-01-01T00:00"}\n')
    zoned = tmp_path / "zoned.jsonl"
    zoned.write_text('{"kind": "ok"}\n')
    cases = [
        (["enqueue", "k", "--run-at", "2030-01-01T00:00", "--dsn", dsn], {}),
        (["enqueue", "k", "--run-at", "2030-01-01T00:00", "--dsn", dsn], {"TZ": "JST-9"}),
        (["enqueue", "--file", str(lines), "--dsn", dsn], {}),
        (["enqueue", "--file", str(zoned), "--run-at", "2030-01-01T00:00", "--dsn", dsn], {}),
    ]
    for args, code, out, err in run_all(cases):
        line = one_line(args, err)
        assert code == EXIT_USAGE, (args, code, err)
        assert "'2030-01-01T00:00' has no time zone" in line and "2030-01-01T00:00+01:00" in line, line
        assert out == ""
        if args[1] == str(lines):
            assert line.startswith("jobsup: error: line 2: "), line
    assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0] == 0


# --- negative durations ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["-5", "-5m", " -400ms", "-0.5", -5, -0.5])
def test_a_negative_duration_must_be_0_or_more(text):
    with pytest.raises(BadInput) as caught:
        parse_duration(text)
    assert "must be 0 or more" in str(caught.value), caught.value
    assert "not a duration" not in str(caught.value)


def test_the_duration_type_says_0_or_more_and_still_names_what_is_no_duration():
    with pytest.raises(argparse.ArgumentTypeError, match="must be 0 or more"):
        duration("-5")
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        duration("soon")
    assert duration("0") == 0.0


@pytest.mark.slow  # the CLI in subprocesses
def test_every_duration_flag_says_0_or_more_for_a_negative_value(dsn):
    cases = [
        (["prune", "--keep-done", "-5", "--dsn", dsn], {}),
        (["enqueue", "k", "--delay", "-5", "--dsn", dsn], {}),
        (["start", "--app", APP, "--keep-done", "-5", "--dsn", dsn], {}),
        (["start", "--app", APP, "--dsn", dsn], {"JOBSUP_KEEP_DEAD": "-1h"}),
        (["doctor", "--stale-after", "-5", "--dsn", dsn], {}),
    ]
    for args, code, _out, err in run_all(cases):
        line = one_line(args, err)
        assert code == EXIT_USAGE, (args, code, err)
        assert "must be 0 or more" in line, line


# --- a DSN that does not parse -----------------------------------------------------------------------

UNPARSED = [
    f"postgresql//u:{SECRET}@db/x",
    "hello world",
    f"host=127.0.0.1 password={SECRET} bogus",
    f"host=127.0.0.1 password='{SECRET}",
]


@pytest.mark.parametrize("bad", UNPARSED)
def test_a_dsn_that_does_not_parse_is_bad_input(bad):
    with pytest.raises(BadInput) as caught:
        dsns.check(bad)
    assert caught.value.exit_code == EXIT_USAGE
    assert isinstance(caught.value, DatabaseUnavailable)  # what callers that catch it already expect
    assert SECRET not in str(caught.value) and "not a valid DSN" in str(caught.value)


@pytest.mark.slow  # the CLI in subprocesses
def test_a_dsn_that_does_not_parse_exits_2_and_one_that_cannot_connect_exits_1():
    down = f"postgresql://u:{SECRET}@127.0.0.1:1/x"
    cases: list[tuple[list[str], dict[str, str]]] = []
    for bad in UNPARSED:
        cases += [
            (["stats", "--dsn", bad], {}),
            (["enqueue", "k"], {"JOBSUP_DSN": bad}),
            (["migrate"], {"DATABASE_URL": bad}),
            (["start", "--app", APP, "--procs", "1", "--dsn", bad], {}),
            (["start", "--app", APP, "--procs", "1", "--dsn", down, "--listen-dsn", bad], {}),
        ]
    cases.append((["stats", "--dsn", down], {}))
    for args, code, out, err in run_all(cases):
        line = one_line(args, err)
        assert SECRET not in out + err, (args, err)
        assert "worker.spawned" not in out + err  # refused before any worker starts
        if down in args and "--listen-dsn" not in args:
            assert code == 1 and "cannot connect" in line, (args, code, err)
        else:
            assert code == EXIT_USAGE and "not a valid DSN" in line, (args, code, err)


# --- which server lacks the schema -------------------------------------------------------------------


def test_a_missing_schema_names_the_database_and_server_but_not_the_password(empty_dsn, pg_data_dir):
    import psycopg

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        with pytest.raises(SchemaMissing) as caught:
            require_schema(conn)
        info = conn.info
        dbname, host, port, password = info.dbname, info.host, info.port, info.password
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert "the jobsup schema is not in this database" in message
    assert f"database {dbname!r}" in message, message
    if pg_data_dir is not None:  # the embedded server: named by its data directory
        assert f"the embedded PostgreSQL in {pg_data_dir}" in message, message
    else:
        assert host in message and str(port) in message, message
    assert "--data-dir" in message and "JOBSUP_DATA_DIR" in message and "--dsn" in message
    if password:
        assert password not in message


@pytest.mark.slow  # the CLI in a subprocess
def test_a_command_on_an_embedded_server_without_the_schema_names_its_data_directory(pg_data_dir):
    if pg_data_dir is None:
        pytest.skip("the tests use JOBSUP_TEST_DSN, not an embedded server")
    # The server the tests run is the embedded one of pg_data_dir; its own database has no schema (each
    # test has a database of its own), as a second embedded server started by a forgotten
    # JOBSUP_DATA_DIR would not.
    [(args, code, out, err)] = run_all([(["stats"], {"JOBSUP_DATA_DIR": str(pg_data_dir)})])
    line = one_line(args, err)
    assert code == 1 and out == "", (code, out, err)
    assert line.startswith("jobsup: error: the jobsup schema is not in this database"), line
    assert f"the embedded PostgreSQL in {Path(pg_data_dir)}" in line, line
    assert "JOBSUP_DATA_DIR" in line and "--dsn" in line and "jobsup migrate" in line


# --- values a minus begins, values from the environment, the flags --help offers ---------------------


@pytest.mark.slow  # the CLI in subprocesses
def test_a_value_that_a_minus_and_a_digit_begin_reaches_the_options_own_check(dsn):
    # argparse alone takes `-5s` for an unknown option: "expected one argument".
    cases = [
        (["enqueue", "k", "--delay", "-5s", "--dsn", dsn], "must be 0 or more, not '-5s'"),
        (["limit", "k", "--rate", "-1/s", "--dsn", dsn], "not '-1/s'"),
        (["limit", "k", "--key-rate", "-1/s", "--dsn", dsn], "not '-1/s'"),
        (["start", "--app", APP, "--lease", "-1.5s", "--dsn", dsn], "must be 0 or more"),
    ]
    for (args, code, _out, err), (_, says) in zip(run_all([(args, {}) for args, _ in cases]), cases, strict=True):
        line = one_line(args, err)
        assert code == EXIT_USAGE, (args, code, err)
        assert says in line and "expected one argument" not in line, line


@pytest.mark.slow  # the CLI in subprocesses
def test_a_bad_value_of_a_variable_names_the_variable(dsn):
    cases = [
        (["start", "--app", APP, "--dsn", dsn], {"JOBSUP_PROCS": "abc"}),
        (["start", "--app", APP, "--dsn", dsn], {"JOBSUP_KEEP_DEAD": "-1h"}),
    ]
    (_, code, _, err), (_, code2, _, err2) = run_all(cases)
    assert code == code2 == EXIT_USAGE
    assert "JOBSUP_PROCS (the default of --procs): not a whole number: 'abc'" in one_line(cases[0][0], err)
    assert "JOBSUP_KEEP_DEAD (the default of --keep-dead): a duration must be 0 or more" in one_line(cases[1][0], err2)
    # The flag given on the command line wins, and is what a refusal of it names.
    [(args, code, _, err)] = run_all([(["start", "--app", APP, "--procs", "x", "--dsn", dsn], {"JOBSUP_PROCS": "x"})])
    assert code == EXIT_USAGE and "argument --procs: not a whole number: 'x'" in one_line(args, err)


def test_db_help_offers_no_dsn_and_db_still_says_why_it_refuses_one(capsys):
    with pytest.raises(SystemExit):
        main(["db", "--help"])
    shown = capsys.readouterr().out
    assert "--data-dir" in shown and "--dsn" not in shown, shown
    assert main(["db", "url", "--dsn", "postgresql://u@h/db"]) == EXIT_USAGE
    assert "--dsn names a server of your own" in capsys.readouterr().err


# --- Ctrl-C in the first moments of a command ---------------------------------------------------------


# Moments of a command's start, each the end of an import that `-X importtime` reports: the entry
# point's first lines, the CLI's package (psycopg with it), then what the commands' modules import as
# the parser loads them one by one (enqueue's, stats', bench's, check's).
MOMENTS = ["jobsup.__main__", "jobsup.cli", "jobsup.job", "jobsup.ops.snapshot", "jobsup.ops.bench", "jobsup.ops.check"]


@pytest.mark.slow  # the CLI in subprocesses
@pytest.mark.parametrize("after", [0.0, 0.03])
@pytest.mark.parametrize("moment", MOMENTS)
def test_a_ctrl_c_in_the_first_moments_of_a_command_exits_130_without_a_traceback(dsn, moment, after):
    # Before jobsup.__main__ has run, Python itself is starting (site, the editable install's finder):
    # none of jobsup's code can run there.
    script = Path(sys.executable).with_name("jobsup")  # the console script, run as its shebang would
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", str(script), "stats", "--dsn", dsn],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == moment:
            break
    else:
        pytest.fail(f"{moment} was never imported: {proc.wait()}")
    try:
        proc.wait(timeout=after)  # the moment under test, unless the command ends first
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert proc.returncode in (0, 130), (proc.returncode, said)
    assert not [line for line in said if "Traceback" in line or "KeyboardInterrupt" in line], said
