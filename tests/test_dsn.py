"""Which database jobsup uses, how it reports one it cannot use, and the embedded default."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import psycopg
import pytest

from jobsup import client
from jobsup.db import dsn as dsns
from jobsup.db.migrate import LATEST, available
from jobsup.errors import DatabaseUnavailable

from .helpers import ROOT, TEMPLATE, cli_env, jobsup, wait_for, with_dbname

SECRET = "hunter2"


@pytest.fixture
def other_dsns(server_dsn: str, template_dsn: str):
    """Two more migrated databases, so a test can see which one a command wrote to."""
    names = [f"jobsup_other_{os.getpid()}_{n}" for n in range(2)]
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        for name in names:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE} STRATEGY FILE_COPY")
    try:
        yield [with_dbname(server_dsn, name) for name in names]
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def kinds_in(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT kind FROM jobsup.jobs ORDER BY id")]


# --- precedence ------------------------------------------------------------------------------------


def test_resolve_precedence(monkeypatch):
    monkeypatch.setenv("JOBSUP_DSN", "host=from-jobsup-dsn dbname=a")
    monkeypatch.setenv("DATABASE_URL", "postgresql://from-database-url/b")
    assert dsns.resolve("host=from-flag dbname=c") == "host=from-flag dbname=c"
    assert dsns.resolve(None) == "host=from-jobsup-dsn dbname=a"
    monkeypatch.delenv("JOBSUP_DSN")
    assert dsns.resolve(None) == "postgresql://from-database-url/b"
    # only the DSN that is used must be valid
    monkeypatch.setenv("JOBSUP_DSN", f"host=x password={SECRET} bogus")
    assert dsns.resolve("host=from-flag") == "host=from-flag"
    with pytest.raises(DatabaseUnavailable) as caught:
        dsns.resolve(None)
    assert SECRET not in str(caught.value)


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_cli_precedence(dsn, other_dsns):
    jobsup_dsn, database_url = other_dsns
    both = cli_env(JOBSUP_DSN=jobsup_dsn, DATABASE_URL=database_url)
    assert jobsup("enqueue", "via-flag", "--dsn", dsn, env=both).returncode == 0
    assert jobsup("enqueue", "via-jobsup-dsn", env=both).returncode == 0
    assert jobsup("enqueue", "via-database-url", env=cli_env(DATABASE_URL=database_url)).returncode == 0
    broken = cli_env(JOBSUP_DSN=f"host=x password={SECRET} bogus", DATABASE_URL="nonsense")
    result = jobsup("enqueue", "flag-beats-broken-env", "--dsn", dsn, env=broken)
    assert result.returncode == 0, result.stderr
    assert kinds_in(dsn) == ["via-flag", "flag-beats-broken-env"]
    assert kinds_in(jobsup_dsn) == ["via-jobsup-dsn"]
    assert kinds_in(database_url) == ["via-database-url"]


# --- a DSN that cannot be used -----------------------------------------------------------------------


BAD_DSNS = [
    (f"host=127.0.0.1 password={SECRET} bogus", "not a valid DSN"),
    (f"postgresql://app:{SECRET}@127.0.0.1/app?bogus=1", "not a valid DSN"),
    # typos that make it no URL libpq reads: still named without the password
    (f"postgresql//app:{SECRET}@127.0.0.1:1/app", "not a valid DSN: 'postgresql//app:***@127.0.0.1:1/app'"),
    (f"postgresql:app:{SECRET}@127.0.0.1/app", "not a valid DSN"),
    (f"host=127.0.0.1 password='{SECRET}", "not a valid DSN"),
    (f"postgresql://app:{SECRET}@127.0.0.1:1/app", "cannot connect"),
    (f"postgresql://app:pre?{SECRET}@127.0.0.1:1/app", "cannot connect"),
    (f"postgresql://app:{SECRET}@127.0.0.1:notaport/app", "cannot connect"),
    (f"host=127.0.0.1 port=1 user=app password='{SECRET} x' dbname=app", "cannot connect"),
    (f"host=/nonexistent/socket/dir user=app password={SECRET}", "cannot connect"),
]


@pytest.mark.slow  # the CLI in a subprocess, many times
def test_unusable_dsn_gives_one_line_and_no_password():
    procs = []
    for bad, says in BAD_DSNS:
        # each command, and each place a DSN can come from
        for args, env in (
            (["stats", "--dsn", bad], cli_env()),
            (["enqueue", "k", "{}"], cli_env(JOBSUP_DSN=bad)),
            (["migrate"], cli_env(DATABASE_URL=bad)),
        ):
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobsup", *args],
                cwd=ROOT,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            procs.append((bad, says, args, proc))
    for bad, says, args, proc in procs:
        out, err = proc.communicate(timeout=180)  # many at once, on a loaded machine
        where = (bad, args, out, err)
        assert proc.returncode == (2 if says.startswith("not a valid DSN") else 1), where  # bad input, or no server
        assert SECRET not in out + err, where
        assert "Traceback" not in err, where
        lines = err.strip().splitlines()
        assert len(lines) == 1, where
        assert lines[0].startswith("jobsup: error: ") and says in lines[0], where
        assert "***" in lines[0], where  # the DSN is named, its password masked


def test_connect_error_names_the_server_not_the_password():
    with pytest.raises(DatabaseUnavailable) as caught:
        dsns.connect(f"postgresql://app:{SECRET}@127.0.0.1:1/app")
    message = str(caught.value)
    assert SECRET not in message and "127.0.0.1" in message and "app:***@" in message


# --- redact ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
        ("postgres://app:s3cret@db/app?sslmode=require", "postgres://app:***@db/app?sslmode=require"),
        (
            "postgresql://app:s3cret@db/app?password=x&sslmode=require",
            "postgresql://app:***@db/app?password=***&sslmode=require",
        ),
        ("postgresql://db/app?sslmode=require&PASSWORD=x", "postgresql://db/app?sslmode=require&PASSWORD=***"),
        ("postgresql://app:pa?ss@db/app", "postgresql://app:***@db/app"),  # libpq's password ends at @ or /
        ("postgresql://app:pa#ss@db/app", "postgresql://app:***@db/app"),
        ("postgresql://app:p%40ss@h1:5432,h2:5433/app", "postgresql://app:***@h1:5432,h2:5433/app"),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
        ("postgresql://app:@/app?host=/tmp/x", "postgresql://app:@/app?host=/tmp/x"),  # nothing to hide
        ("postgresql://db:5432/app", "postgresql://db:5432/app"),
        ("host=db password=s3cret user=app", "host=db password=*** user=app"),
        ("host=db password = s3cret user=app", "host=db password = *** user=app"),
        ("host=db password='a b\\' c' user=app", "host=db password=*** user=app"),
        ("host=db PASSWORD=s3cret", "host=db PASSWORD=***"),
        ("host=db user=app", "host=db user=app"),
    ],
)
def test_redact(raw, shown):
    assert dsns.redact(raw) == shown


def test_redact_leaves_no_password_libpq_would_use():
    from psycopg import conninfo

    for raw in [
        "postgresql://u:a?b#c@h/d",
        "postgresql://u:x@h/d?password=y",
        "host=h password='q r'",
        "postgresql://u:%3Fz@h/d",
    ]:
        password = conninfo.conninfo_to_dict(raw)["password"]
        assert password not in dsns.redact(raw), raw


# --- the embedded default ----------------------------------------------------------------------------


def postmasters(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(data_dir) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.mark.slow  # starts an embedded PostgreSQL of its own
@pytest.mark.skipif(bool(os.environ.get("JOBSUP_TEST_DSN")), reason="uses the embedded PostgreSQL")
def test_embedded_default_needs_no_configuration():
    home = Path(tempfile.mkdtemp(prefix="js-", dir="/tmp"))  # short: a Unix socket path has ~107 bytes
    data_dir = home / "pg"
    env = cli_env(JOBSUP_DATA_DIR=str(data_dir))
    assert "JOBSUP_DSN" not in env and "DATABASE_URL" not in env

    def start(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "jobsup", *args],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def finish(*procs: subprocess.Popen) -> list[str]:
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, (proc.args, out, err)
            outs.append(out)
        return outs

    try:
        # two processes at once on a fresh directory: one server is made, both use it
        outs = finish(start("migrate"), start("migrate"))
        applied = "\n".join(f"applied migration {m.version:04d}_{m.name}" for m in available())
        assert sorted(o.strip() for o in outs) == [applied, f"schema up to date (version {LATEST})"]
        finish(start("enqueue", "email", '{"to": "a"}'), start("enqueue", "sms", "--queue", "texts"))
        finish(start("enqueue", "email", '{"to": "b"}'))
        [stats] = finish(start("stats", "--json"))
        by_kind = {k["kind"]: k["ready"] for k in json.loads(stats)["kinds"]}
        assert by_kind == {"email": 2, "sms": 1}
        [url] = finish(start("db", "url"))
        assert len(postmasters(data_dir)) == 1
        with psycopg.connect(url.strip(), autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0] == 3
        assert (data_dir / "PG_VERSION").exists()
    finally:
        stop = jobsup("db", "stop", env=env)
        try:
            assert stop.returncode == 0, stop.stderr
            assert stop.stdout.strip() == f"stopped the embedded PostgreSQL in {data_dir}"
            wait_for(lambda: not postmasters(data_dir), message="the embedded server to exit")
            again = jobsup("db", "stop", env=env)
            assert again.stdout.strip() == f"no embedded PostgreSQL was running in {data_dir}"
            url = jobsup("db", "url", env=env)
            assert url.returncode == 1 and "no embedded PostgreSQL is running" in url.stderr
        finally:
            for proc in postmasters(data_dir):  # only ever the server this test started
                proc.kill()
            shutil.rmtree(home, ignore_errors=True)


def test_a_handler_reaches_its_supervisors_database_with_nothing_exported(conn, dsn, start):
    # The supervisor is told its database by --dsn only; the environment names none, and the embedded
    # default is unusable (a file): a handler that resolved the database itself would fail.
    sup = start(app="tests.apps.reach:app", env={"JOBSUP_DATA_DIR": str(ROOT / "README.md")})
    [job_id] = client.enqueue_many(conn, [{"kind": "whose-database"}])
    finished = "SELECT status NOT IN ('queued', 'running') FROM jobsup.jobs WHERE id = %s"
    wait_for(lambda: conn.execute(finished, [job_id]).fetchone()[0], 30, message=f"job {job_id}\n{sup.log()}")
    status, error, value = conn.execute(
        "SELECT status, last_error, return_value FROM jobsup.jobs WHERE id = %s", [job_id]
    ).fetchone()
    assert status == "done", (error, sup.log())
    assert value == {"env": dsn, "dsn": dsn, "database": conn.info.dbname}
