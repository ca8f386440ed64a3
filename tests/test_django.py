"""Django's Tasks framework on jobsup: a real Django project (tests/django_project) on the test's own
database, enqueueing in this process and run by a real `jobsup start --django`.

Runs on Django 5.2 with the django-tasks backport (`make test`) and on Django 6 (`make test-django6`).
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from functools import partial

import psycopg
import pytest

from jobsup import client

from .helpers import cli_env, jobsup, wait_for

django = pytest.importorskip("django")

SETTINGS = "tests.django_project.settings"


@pytest.fixture
def django_db(dsn: str):
    """Django set up in this process (once), its default connection pointed at this test's database."""
    os.environ.setdefault("JOBSUP_TEST_DJANGO_DSN", dsn)
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    django.setup()
    from django.db import connections

    from jobsup.django import database
    from tests.django_project.docs.models import Thing

    connection = connections["default"]
    connection.close()
    for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS"):
        connection.settings_dict[key] = database(dsn)[key]
    with connection.schema_editor() as editor:
        editor.create_model(Thing)
    yield dsn
    connection.close()


@pytest.fixture
def start_django(start, dsn: str):
    """start_django(*flags, procs=2, app=None) runs `jobsup start --django` on this test's database."""

    def _start(*args: str, procs: int = 2, app: str | None = None, env: dict[str, str] | None = None):
        env = {"JOBSUP_TEST_DJANGO_DSN": dsn, **(env or {})}
        sup = start("--django", SETTINGS, *args, procs=procs, app=app, env=env)
        sup.wait_ready()
        return sup

    return _start


def finished(result):
    """Wait until a TaskResult is finished, refreshing it from the database."""

    def done():
        result.refresh()
        return result.is_finished

    wait_for(done, timeout=30, message=f"task result {result.id} to finish")
    return result


def jobs(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT id, kind, queue, payload, status FROM jobsup.jobs ORDER BY id").fetchall()


# --- enqueueing ------------------------------------------------------------------------------------


def test_enqueue_inside_atomic_rolls_back_and_commits_with_the_transaction(django_db, conn):
    from django.db import transaction

    from tests.django_project.tasks import add

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback):
        with transaction.atomic():
            add.enqueue(1, 2)
            assert len(jobs(conn)) == 0  # not committed: another connection does not see it
            raise Rollback
    assert jobs(conn) == []

    with transaction.atomic():
        result = add.enqueue(1, b=2)
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in jobs(conn)] == [
        (
            int(result.id),
            "tests.django_project.tasks.add",
            "default",
            {"args": [1], "kwargs": {"b": 2}, "backend": "default"},
            "queued",
        )
    ]
    assert str(result.status) == "READY" and result.enqueued_at is not None and result.attempts == 0


def test_enqueue_maps_priority_queue_and_run_after(django_db, conn):
    from django.utils import timezone

    from tests.django_project.tasks import add

    later = timezone.now() + timedelta(hours=1)
    result = add.using(priority=-7, queue_name="reports", run_after=later).enqueue(1, 1)
    row = conn.execute(
        "SELECT priority, queue, run_at, max_attempts FROM jobsup.jobs WHERE id = %s", [int(result.id)]
    ).fetchone()
    assert row == (-7, "reports", later, 2)  # max_attempts from the backend's OPTIONS
    fetched = add.get_result(result.id)
    assert (fetched.task.priority, fetched.task.queue_name, fetched.task.run_after) == (-7, "reports", later)


def test_a_non_json_argument_raises_the_frameworks_error_at_enqueue(django_db, conn):
    from django.utils import timezone

    from jobsup.django import InvalidArguments, InvalidTask
    from tests.django_project.tasks import add

    with pytest.raises(TypeError, match="Object of type datetime is not JSON serializable") as caught:
        add.enqueue(timezone.now(), 1)
    assert isinstance(caught.value, InvalidTask) and isinstance(caught.value, InvalidArguments)
    with pytest.raises(InvalidTask, match="not JSON: Out of range float"):
        add.enqueue(float("nan"), 1)
    with pytest.raises(InvalidTask, match="NUL character"):
        add.enqueue("a\x00b", 1)
    assert jobs(conn) == []


def test_the_arguments_errors_speak_of_them_in_the_plural(django_db, conn, monkeypatch):
    from django.utils import timezone

    from jobsup.django import InvalidArguments
    from tests.django_project.tasks import add

    task = "the arguments of task tests.django_project.tasks.add"
    with pytest.raises(InvalidArguments) as caught:
        add.enqueue(timezone.now(), 1)
    assert str(caught.value) == f"{task} are not JSON: Object of type datetime is not JSON serializable"
    with pytest.raises(InvalidArguments) as caught:
        add.enqueue(b"\xff", 1)  # bytes are text to the framework, when they are UTF-8
    assert str(caught.value) == f"{task} are not JSON: Unsupported value: <class 'bytes'>"
    with pytest.raises(InvalidArguments) as caught:
        add.enqueue("a\x00b", 1)
    assert str(caught.value) == f"{task} hold a NUL character (\\u0000), which PostgreSQL cannot store in jsonb"
    monkeypatch.setenv("JOBSUP_MAX_PAYLOAD", "40")
    with pytest.raises(InvalidArguments) as caught:
        add.enqueue("x" * 40, 1)
    assert str(caught.value) == f"{task} are 87 bytes, over the limit of 40 (JOBSUP_MAX_PAYLOAD)"
    assert jobs(conn) == []


def test_arguments_are_normalized_as_the_frameworks_backends_do_before_they_are_checked(django_db, conn):
    from tests.django_project.tasks import add

    # bytes become text and any sequence a list, as django's normalize_json makes them
    result = add.enqueue(b"abc", range(3))
    assert (result.args, result.kwargs) == (["abc", [0, 1, 2]], {})
    keyed = add.enqueue(a=(1, 2), b={"k": b"v"})
    assert keyed.kwargs == {"a": [1, 2], "b": {"k": "v"}}
    assert [row[3] for row in jobs(conn)] == [
        {"args": ["abc", [0, 1, 2]], "kwargs": {}, "backend": "default"},
        {"args": [], "kwargs": {"a": [1, 2], "b": {"k": "v"}}, "backend": "default"},
    ]
    assert add.get_result(result.id).args == ["abc", [0, 1, 2]]


def test_a_task_the_backend_cannot_accept_raises_invalid_task(django_db):
    from jobsup.django import InvalidTask
    from tests.django_project.tasks import add

    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        add.using(priority=101)


def test_unknown_backend_option_is_refused_with_the_known_ones(django_db):
    from jobsup.django import InvalidTaskBackend, JobsupBackend

    with pytest.raises(
        InvalidTaskBackend,
        match=r"unknown option\(s\) bogus, retries; .* knows app, database, max_attempts",
    ):
        JobsupBackend("other", {"OPTIONS": {"bogus": 1, "retries": 2}})
    with pytest.raises(InvalidTaskBackend, match="max_attempts'] must be a whole number >= 1"):
        JobsupBackend("other", {"OPTIONS": {"max_attempts": 0}})
    backend = JobsupBackend("other", {})
    assert (
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
        backend.supports_priority,
    ) == (True, True, True, True)
    assert list(backend.check()) == []


def test_get_result_of_what_is_not_a_task_result(django_db, conn):
    from django.tasks import default_task_backend

    from jobsup.django import TaskResultDoesNotExist

    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("12345")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("not-a-number")
    job_id = client.enqueue(conn, "email", {"to": "a@example.com"})
    with pytest.raises(TaskResultDoesNotExist, match="a jobsup job of kind 'email', not a Django task"):
        default_task_backend.get_result(str(job_id))
    # A payload shaped like a task's, but its kind names what is not a task.
    shaped = client.enqueue(conn, "subprocess.check_output", {"args": [["true"]], "kwargs": {}, "backend": "default"})
    with pytest.raises(
        TaskResultDoesNotExist,
        match=r"job \d+ is a jobsup job of kind 'subprocess.check_output', not a Django task: it is a function",
    ):
        default_task_backend.get_result(str(shaped))


# --- running ---------------------------------------------------------------------------------------


def test_the_supervisor_runs_sync_async_and_context_tasks(django_db, start_django):
    from tests.django_project.tasks import add, async_add, with_context

    sync = add.enqueue(2, 3)
    coro = async_add.enqueue(a=4, b=5)
    ctx = with_context.enqueue("hello")
    start_django()
    assert finished(sync).return_value == 5
    assert str(sync.status) == "SUCCESSFUL" and sync.attempts == 1 and sync.errors == []
    assert sync.started_at <= sync.finished_at and sync.enqueued_at <= sync.started_at
    assert sync.worker_ids[0].count(":") == 2  # the supervisor's id, host:pid:tag
    assert finished(coro).return_value == {"sum": 9, "async": True}
    # The context's task result was read when the task ran: running, attempt 1, this very id.
    assert finished(ctx).return_value == {"attempt": 1, "id": ctx.id, "note": "hello", "status": "RUNNING"}


def test_async_api_enqueue_and_get_result(django_db, start_django):
    from django.tasks import default_task_backend

    from tests.django_project.tasks import add

    async def scenario():
        result = await add.aenqueue(20, 22)
        fetched = await default_task_backend.aget_result(result.id)
        assert fetched.id == result.id and str(fetched.status) == "READY"
        return result

    result = asyncio.run(scenario())
    start_django()
    finished(result)
    assert asyncio.run(add.aget_result(result.id)).return_value == 42


def test_a_failing_task_retries_and_ends_failed_with_its_errors(django_db, start_django):
    from tests.django_project.tasks import always_fails, fails_once

    failing = always_fails.enqueue("no luck")
    flaky = fails_once.enqueue()
    start_django()
    finished(failing)
    assert str(failing.status) == "FAILED" and failing.attempts == 2 and len(failing.worker_ids) == 2
    assert [e.exception_class for e in failing.errors] == [ValueError, ValueError]
    assert "ValueError: always fails: no luck" in failing.errors[-1].traceback
    assert "in always_fails\n    raise ValueError" in failing.errors[0].traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = failing.return_value
    assert finished(flaky).return_value == 2
    assert str(flaky.status) == "SUCCESSFUL" and flaky.attempts == 2
    assert [e.exception_class for e in flaky.errors] == [RuntimeError]


def test_a_non_json_return_value_fails_the_attempt(django_db, start_django):
    from tests.django_project.tasks import returns_set

    result = returns_set.enqueue()
    start_django()
    finished(result)
    assert str(result.status) == "FAILED"
    assert result.errors[-1].exception_class is TypeError  # as the framework's own backends fail it


def test_priority_and_run_after_are_honoured(django_db, start_django):
    from django.utils import timezone

    from tests.django_project.docs.models import Thing
    from tests.django_project.tasks import record

    low = [record.using(priority=-5).enqueue(i) for i in (1, 2, 3)]
    high = [record.using(priority=50).enqueue(i) for i in (4, 5, 6)]
    start_django(procs=1)  # one worker: tasks run one after another, in the order claimed
    later = timezone.now() + timedelta(seconds=3)
    deferred = record.using(priority=100, run_after=later).enqueue(7)
    for result in low + high + [deferred]:
        finished(result)
    # Higher priority first, then in enqueue order; the deferred one, though highest, waits for its time.
    assert list(Thing.objects.order_by("id").values_list("num", flat=True)) == [4, 5, 6, 1, 2, 3, 7]
    assert deferred.started_at >= later


def test_a_task_whose_module_cannot_be_imported_fails_that_attempt_and_the_pool_lives(django_db, conn, start_django):
    from tests.django_project.tasks import add, pid

    payload = {"args": [], "kwargs": {}, "backend": "default"}
    missing = client.enqueue(conn, "tests.django_project.gone.task", payload, max_attempts=1)
    broken = client.enqueue(conn, "tests.django_project.broken_tasks.task", payload, max_attempts=1)
    sup = start_django(procs=1)
    before = finished(pid.enqueue()).return_value

    def dead(job_id):
        return conn.execute("SELECT last_error FROM jobsup.jobs WHERE id = %s AND status = 'dead'", [job_id]).fetchone()

    assert wait_for(lambda: dead(missing))[0] == (
        "ImportError: task tests.django_project.gone.task cannot be imported: ModuleNotFoundError: "
        "No module named 'tests.django_project.gone'"
    )
    assert wait_for(lambda: dead(broken))[0] == (
        "ImportError: task tests.django_project.broken_tasks.task cannot be imported: RuntimeError: "
        "broken_tasks cannot be imported"
    )
    assert finished(add.enqueue(1, 1)).return_value == 2
    assert finished(pid.enqueue()).return_value == before  # the same worker process: the pool lived
    assert "worker.died" not in sup.log()


@pytest.mark.slow  # `jobsup start` in a subprocess
def test_a_settings_module_that_does_not_exist_exits_3_with_the_reason(dsn):
    result = jobsup("start", "--dsn", dsn, "--django", "nowhere.settings", "--procs", "1", env=cli_env(), timeout=90)
    assert result.returncode == 3, result.stderr
    assert (
        "cannot set up Django with settings 'nowhere.settings' (from --django): ModuleNotFoundError: "
        "No module named 'nowhere'" in result.stderr
    )


def test_start_needs_app_or_django(dsn):
    result = jobsup("start", "--dsn", dsn, env=cli_env())
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "jobsup: error: jobsup start needs --app module:attribute (or JOBSUP_APP), "
        "or --django settings.module (or JOBSUP_DJANGO)"
    )


def test_plain_handlers_run_beside_tasks_and_their_return_values_are_stored(django_db, conn, start_django):
    from tests.django_project.tasks import add

    answer = client.enqueue(conn, "answer", {"who": "me"})
    bad = client.enqueue(conn, "returns_set")
    task = add.enqueue(1, 2)
    start_django(app="tests.django_project.jobs:app")
    finished(task)

    def row(job_id):
        return conn.execute(
            "SELECT status, return_value, last_error FROM jobsup.jobs WHERE id = %s AND status IN ('done', 'dead')",
            [job_id],
        ).fetchone()

    assert wait_for(lambda: row(answer)) == ("done", {"answer": 42, "for": "me"}, None)
    assert wait_for(lambda: row(bad)) == (
        "dead",
        None,
        "ReturnValueError: return value of a 'returns_set' job is not JSON: "
        "Object of type set is not JSON serializable",
    )
    assert row(int(task.id))[1] == 3


def test_the_task_signals_are_sent_as_the_frameworks_backends_send_them(django_db, start_django, tmp_path, monkeypatch):
    from tests.django_project.tasks import add, always_fails, returns_set, with_context

    # tests/django_project/signals.py records every signal it receives, in this process and the workers
    record = tmp_path / "signals.jsonl"
    monkeypatch.setenv("JOBSUP_TEST_SIGNALS", str(record))
    done = add.enqueue(2, 3)
    failing = always_fails.enqueue("no luck")  # two attempts: the backend's max_attempts
    bad_return = returns_set.enqueue()
    ctx = with_context.enqueue("hi")
    start_django(env={"JOBSUP_TEST_SIGNALS": str(record)})
    for result in (done, failing, bad_return, ctx):
        finished(result)

    def signals(result):
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        return [{k: v for k, v in line.items() if k != "id"} for line in lines if line["id"] == result.id]

    for result in (failing, bad_return):
        wait_for(lambda r=result: len(signals(r)) == 5, timeout=30, message=f"the signals of task result {result.id}")
    sender = "jobsup.django.JobsupBackend"
    enqueued = {"signal": "task_enqueued", "sender": sender, "status": "READY", "attempts": 0, "errors": []}
    assert signals(done) == [
        {**enqueued, "task": "tests.django_project.tasks.add", "args": [2, 3]},
        {
            "signal": "task_started",
            "sender": sender,
            "task": "tests.django_project.tasks.add",
            "args": [2, 3],
            "status": "RUNNING",
            "attempts": 1,
            "errors": [],
            "started": True,
            "finished": False,
            "worker_pid": signals(done)[1]["worker_pid"],
        },
        {
            "signal": "task_finished",
            "sender": sender,
            "task": "tests.django_project.tasks.add",
            "args": [2, 3],
            "status": "SUCCESSFUL",
            "attempts": 1,
            "errors": [],
            "started": True,
            "finished": True,
            "return_value": 5,
            "worker_pid": signals(done)[1]["worker_pid"],
        },
    ]
    assert signals(done)[1]["worker_pid"] != os.getpid()  # sent by the worker that ran the task
    # Each attempt is a run of the task: started, then finished FAILED with that attempt's error, even
    # when jobsup retries it.
    assert [(s["signal"], s["status"], s["attempts"], s["errors"]) for s in signals(failing)] == [
        ("task_enqueued", "READY", 0, []),
        ("task_started", "RUNNING", 1, []),
        ("task_finished", "FAILED", 1, ["builtins.ValueError"]),
        ("task_started", "RUNNING", 2, ["builtins.ValueError"]),
        ("task_finished", "FAILED", 2, ["builtins.ValueError", "builtins.ValueError"]),
    ]
    # A return value the framework refuses fails the run, as with Django's own backends.
    assert [(s["signal"], s["status"], s["errors"]) for s in signals(bad_return)] == [
        ("task_enqueued", "READY", []),
        ("task_started", "RUNNING", []),
        ("task_finished", "FAILED", ["builtins.TypeError"]),
        ("task_started", "RUNNING", ["builtins.TypeError"]),
        ("task_finished", "FAILED", ["builtins.TypeError", "builtins.TypeError"]),
    ]
    assert [(s["signal"], s["status"]) for s in signals(ctx)] == [
        ("task_enqueued", "READY"),
        ("task_started", "RUNNING"),
        ("task_finished", "SUCCESSFUL"),
    ]
    assert signals(ctx)[-1]["return_value"]["status"] == "RUNNING"  # what the task saw in its context


# --- Django's own documentation, run unchanged (tests/django_project/docs/) ---------------------------


def test_the_documentation_examples(django_db, start_django, conn):
    from django.db import transaction
    from django.tasks import default_task_backend

    from tests.django_project.docs import attributes, context, defining, serialization, transactions
    from tests.django_project.docs.models import Thing

    # Defining Tasks; Modifying Tasks.
    assert (attributes.email_users.priority, attributes.email_users.queue_name) == (2, "emails")
    assert defining.email_users.priority == 0
    assert defining.email_users.using(priority=10).priority == 10

    # Enqueueing Tasks: the documentation's call, then the same for the other two definitions.
    result = defining.email_users.enqueue(
        emails=["user@example.com"],
        subject="You have a message",
        message="Hello there!",
    )
    emails = attributes.email_users.enqueue(emails=["a@example.com"], subject="s", message="m")
    contextual = context.email_users.enqueue(emails=["b@example.com"], subject="s", message="m")

    # JSON arguments.
    with pytest.raises(TypeError, match="Object of type datetime is not JSON serializable"):
        from datetime import datetime

        serialization.process_data.enqueue(datetime.now())
    doubled = serialization.double_dictionary.enqueue((1, 2, 3))

    # Transactions: on_commit enqueues only once the Thing exists.
    with transaction.atomic():
        Thing.objects.create(num=1)
        transaction.on_commit(partial(transactions.my_task.enqueue, thing_num=1))
        assert conn.execute("SELECT count(*) FROM jobsup.jobs WHERE kind LIKE '%my_task'").fetchone()[0] == 0
    on_commit_id = conn.execute("SELECT id FROM jobsup.jobs WHERE kind LIKE '%my_task'").fetchone()[0]

    # Task results: not finished yet.
    assert str(result.status) == "READY"
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value

    start_django("--queues", "default,emails")
    finished(result)
    assert str(result.status) == "SUCCESSFUL" and result.return_value == 1  # send_mail: one sent
    assert defining.email_users.get_result(result.id).return_value == 1
    assert default_task_backend.get_result(result.id).return_value == 1
    assert finished(emails).return_value == 1 and finished(contextual).return_value == 1

    finished(doubled)
    assert str(doubled.status) == "FAILED"
    assert doubled.errors[0].traceback.rstrip().endswith("TypeError: unhashable type: 'list'")
    assert doubled.errors[0].exception_class is TypeError

    assert str(finished(default_task_backend.get_result(str(on_commit_id))).status) == "SUCCESSFUL"


def test_jobsup_top_and_stats_show_tasks_by_module_path(django_db, conn):
    from tests.django_project.tasks import add

    add.enqueue(1, 1)
    stats = json.loads(jobsup("stats", "--json", "--dsn", django_db).stdout)
    assert "tests.django_project.tasks.add" in json.dumps(stats)
