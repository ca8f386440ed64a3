"""The rules every enqueue shares: a payload is a JSON object; an app refuses a kind it has no handler
for; `jobsup enqueue --app` applies the app's handler defaults and refuses its unknown kinds."""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path

import psycopg
import pytest

import jobsup
from jobsup import App, JobSpec, client
from jobsup.errors import BadInput
from jobsup.ops.snapshot import rows

from .helpers import ROOT, cli_env, refused_all
from .helpers import jobsup as run_jobsup

NOT_OBJECTS = [([1, 2], "list"), ("hello", "str"), (5, "int"), (1.5, "float"), (True, "bool")]


def count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM jobsup.jobs").fetchone()[0]


def an_app() -> App:
    app = App()

    @app.handler("email", max_attempts=2, queue="mail", priority=4)
    def send(job):  # pragma: no cover - never run here
        return None

    @app.handler("report")
    def report(job):  # pragma: no cover - never run here
        return None

    return app


# --- a payload is a JSON object --------------------------------------------------------------------


def test_a_payload_that_is_not_an_object_is_refused_everywhere(conn, dsn):
    app = an_app()
    for payload, type_name in NOT_OBJECTS:
        calls = [
            lambda p=payload: client.enqueue(conn, "k", p),
            lambda p=payload: client.enqueue(conn, JobSpec("k", p)),
            lambda p=payload: client.enqueue_many(conn, [{"kind": "fine"}, {"kind": "k", "payload": p}]),
            lambda p=payload: client.enqueue_many(conn, [JobSpec("fine"), JobSpec("k", p)]),
            lambda p=payload: app.enqueue(conn, "report", p),
            lambda p=payload: app.enqueue_many(conn, [{"kind": "report", "payload": p}]),
        ]
        for call in calls:
            with pytest.raises(BadInput) as caught:
                call()
            message = str(caught.value)
            assert "JSON object" in message and type_name in message, message
            assert repr("k") in message or repr("report") in message, message

    async def async_calls() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            for payload, _ in NOT_OBJECTS:
                with pytest.raises(BadInput, match="JSON object"):
                    await client.aenqueue(aconn, "k", payload)
                with pytest.raises(BadInput, match="JSON object"):
                    await client.aenqueue_many(aconn, [{"kind": "k", "payload": payload}])

    asyncio.run(async_calls())
    with jobsup.Queue(dsn) as queue:
        with pytest.raises(BadInput, match="payload of a 'k' job must be a JSON object"):
            queue.enqueue("k", [1, 2])
        with pytest.raises(BadInput, match="JSON object"):
            queue.enqueue_many([{"kind": "k", "payload": "x"}])
    assert count(conn) == 0
    # None is {}; an object, nested anything, is fine
    a = client.enqueue(conn, "k")
    b = client.enqueue(conn, "k", {"list": [1, 2], "s": "x"})
    assert [rows(conn, "job", id=i)[0]["payload"] for i in (a, b)] == [{}, {"list": [1, 2], "s": "x"}]


@pytest.mark.slow  # the CLI in subprocesses
def test_the_cli_refuses_a_payload_that_is_not_an_object(dsn, conn, tmp_path):
    cases: list[tuple[list[str], str | tuple[str, ...]]] = [
        (["enqueue", "k", "[1,2]"], ("payload of a 'k' job must be a JSON object", "list")),
        (["enqueue", "k", '"hello"'], ("payload of a 'k' job must be a JSON object", "str")),
        (["enqueue", "k", "3"], ("'k'", "int")),
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"kind": "fine"}\n{"kind": "k", "payload": [1]}\n')
    cases.append((["enqueue", "--file", str(path)], ("line 2:", "payload of a 'k' job must be a JSON object", "list")))
    refused_all(dsn, cases)
    assert count(conn) == 0


# --- an app refuses a kind it has no handler for ---------------------------------------------------


def test_an_app_refuses_a_kind_it_has_no_handler_for(conn, dsn):
    app = an_app()
    calls = [
        lambda: app.enqueue(conn, "emial", {"to": "a"}),
        lambda: app.enqueue(conn, JobSpec("emial")),
        lambda: app.enqueue_many(conn, [{"kind": "email"}, {"kind": "emial"}]),
        lambda: app.enqueue_many(conn, [JobSpec("email"), app.spec("emial")]),
    ]
    for call in calls:
        with pytest.raises(BadInput, match=r"no handler for kind 'emial' \(did you mean 'email'\?\)") as caught:
            call()
        assert "jobsup.enqueue(conn" in str(caught.value)

    async def async_calls() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            with pytest.raises(BadInput, match="did you mean 'email'"):
                await app.aenqueue(aconn, "emial")
            with pytest.raises(BadInput, match="did you mean 'report'"):
                await app.aenqueue_many(aconn, [{"kind": "reprot"}])
        async with jobsup.AsyncQueue(dsn, app=app) as aqueue:
            with pytest.raises(BadInput, match="no handler for kind 'emial'"):
                await aqueue.enqueue("emial")

    asyncio.run(async_calls())
    with jobsup.Queue(dsn, app=app) as queue:
        with pytest.raises(BadInput, match="no handler for kind 'emial'"):
            queue.enqueue("emial")
        with pytest.raises(BadInput, match="no handler for kind 'zzz'"):
            queue.enqueue_many([{"kind": "zzz"}])
    assert count(conn) == 0

    # What may still enqueue any kind: the module-level functions, an app with no handlers, a Queue
    # without an app, and an app that finds kinds by name (Django's).
    class FindsKinds(App):
        finds_kinds = True

    finder = FindsKinds()
    finder.handlers.update(app.handlers)
    ids = [
        jobsup.enqueue(conn, "emial"),
        App().enqueue(conn, "emial"),
        finder.enqueue(conn, "mymodule.tasks.send"),
        app.enqueue(conn, "email"),
    ]
    with jobsup.Queue(dsn) as queue:
        ids.append(queue.enqueue("emial"))
    assert all(ids) and count(conn) == 5


# --- jobsup enqueue --app ----------------------------------------------------------------------------

APP_MODULE = """
from jobsup import App

app = App()


@app.handler("email", max_attempts=2, queue="mail", priority=4)
def send(job):
    pass


@app.handler("plain")
def plain(job):
    pass

not_an_app = 1
"""


def with_app(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "rules_app.py").write_text(textwrap.dedent(APP_MODULE))
    return cli_env(PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")


def enqueue_cli(dsn: str, env: dict[str, str], *args: str, input: str | None = None) -> str:
    result = run_jobsup("enqueue", *args, "--dsn", dsn, env=env, input=input)
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


def options_of(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT kind, queue, priority, max_attempts FROM jobsup.jobs ORDER BY id").fetchall()


@pytest.mark.slow  # the CLI in subprocesses
def test_enqueue_with_app_applies_the_handler_defaults(dsn, conn, tmp_path):
    env = with_app(tmp_path)
    enqueue_cli(dsn, env, "email", '{"to": "a"}', "--app", "rules_app:app")
    enqueue_cli(dsn, env, "email", "--app", "rules_app:app", "--queue", "urgent", "--max-attempts", "7")
    enqueue_cli(dsn, env, "email", "--app", "rules_app:app", "--priority", "0")
    enqueue_cli(dsn, env, "plain", "--app", "rules_app:app")
    enqueue_cli(dsn, env, "email")  # no --app: the defaults of today
    assert options_of(conn) == [
        ("email", "mail", 4, 2),
        ("email", "urgent", 4, 7),
        ("email", "mail", 0, 2),
        ("plain", "default", 0, 3),
        ("email", "default", 0, 3),
    ]
    conn.execute("DELETE FROM jobsup.jobs")
    # --file: a line's field wins, then the flag, then the handler's default
    lines = ['{"kind": "email"}', '{"kind": "email", "queue": "line", "max_attempts": null}', '{"kind": "plain"}']
    out = enqueue_cli(dsn, env, "--file", "-", "--app", "rules_app:app", "--priority", "9", input="\n".join(lines))
    assert out.startswith("enqueued 3 jobs")
    assert options_of(conn) == [("email", "mail", 9, 2), ("email", "line", 9, 2), ("plain", "default", 9, 3)]


@pytest.mark.slow  # the CLI in subprocesses
def test_enqueue_with_app_refuses_an_unknown_kind(dsn, conn, tmp_path):
    env = with_app(tmp_path)
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"kind": "email"}\n{"kind": "emial"}\n')
    cases = [
        (["emial", "--app", "rules_app:app"], ("no handler for kind 'emial'", "did you mean 'email'", "without --app")),
        (["--file", str(path), "--app", "rules_app:app"], ("line 2:", "no handler for kind 'emial'")),
        (["email", "--app", "rules_app:nowhere"], "no attribute 'nowhere'"),
        (["email", "--app", "rules_app:not_an_app"], "not a jobsup App"),
        (["email", "--app", "no_such_module_here:app"], "cannot import"),
        (["email", "--app", "bad target"], "module:attribute"),
    ]
    for args, says in cases:
        result = run_jobsup("enqueue", *args, "--dsn", dsn, env=env)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, (args, result.stderr)
        for text in (says,) if isinstance(says, str) else says:
            assert text in lines[0], (args, text, lines[0])
    assert count(conn) == 0


@pytest.mark.slow  # the CLI in a subprocess
def test_enqueue_help_still_names_the_defaults():
    result = run_jobsup("enqueue", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for says in ("--app", "(default: default)", "(default 0)", "(default 3)"):
        assert says in text, (says, text)
