"""Django's Tasks framework run by jobsup: a task backend, and the app that jobsup's workers run.

    TASKS = {"default": {"BACKEND": "jobsup.django.JobsupBackend", "QUEUES": ["default", "emails"]}}

then `jobsup start --django mysite.settings --queues default,emails`. The backend enqueues through
Django's own connection (so an `atomic()` block that rolls back takes the job with it) and reads results
from jobsup's tables; a task is a jobsup job whose kind is the task's module path and whose payload is
{"args": [...], "kwargs": {...}, "backend": alias}. The same code runs on Django 6 (`django.tasks`) and
on Django 4.2-5.2 with the `django-tasks` backport. This is the only module of jobsup that imports Django.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

try:
    import django
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("jobsup.django needs Django: pip install 'jobsup[django]'") from exc

from django.core import checks
from django.db import close_old_connections, connections
from django.utils import timezone
from django.utils.module_loading import import_string

# Type checkers read the Django 6 branch only (django-stubs types django.tasks): the backport's names are
# the same API as other classes, which mypy would report as incompatible redefinitions.
if TYPE_CHECKING or django.VERSION >= (6, 0):
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

from jobsup import middleware
from jobsup.app import App, Handler, load_app
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.db.sql import one_row
from jobsup.errors import AppNotFound, NoHandler
from jobsup.job import DEFAULT_MAX_ATTEMPTS, Job, JobSpec, encoded_json

# OPTIONS of a TASKS entry, with their defaults. Anything else is refused when the backend is built.
OPTIONS: dict[str, Any] = {
    "database": "default",  # the DATABASES alias whose PostgreSQL holds the jobsup schema
    "max_attempts": DEFAULT_MAX_ATTEMPTS,  # attempts of every task enqueued through this backend
    # "module:attribute" of a jobsup App whose enqueue middleware run for every task enqueued through
    # this backend (tracing's run without it); give the same App to `jobsup start --app` for its run
    # middleware. Imported at the first enqueue.
    "app": None,
}

STATUS = {
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,  # the framework has no status for a task stopped on purpose
}

_PAYLOAD_KEYS = {"args", "kwargs", "backend"}
# The line of a traceback that names the exception: `module.Class: message`, or `Class` alone.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


class InvalidArguments(InvalidTask, TypeError):
    """Task arguments jobsup cannot store: not JSON, a NUL character, or too large. A TypeError too,
    as Django's documentation says a non-JSON argument raises."""


class AttemptLost(Exception):
    """The class of a TaskError for an attempt that ended without an exception of the task's own: its
    worker died or was killed, it ran past its timeout, its lease expired, or a shutdown interrupted it.
    The TaskError's traceback holds jobsup's reason."""


class JobsupBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown option(s) {', '.join(unknown)}; "
                f"jobsup.django.JobsupBackend knows {', '.join(sorted(OPTIONS))}"
            )
        options = {**OPTIONS, **self.options}
        self.database: str = options["database"]
        self.max_attempts: int = options["max_attempts"]
        self.app_target: str | None = options["app"]
        self._app: App | None = None
        if self.app_target is not None and not isinstance(self.app_target, str):
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['app'] must be 'module:attribute' of a jobsup App")
        if not isinstance(self.database, str) or not self.database:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['database'] must name a DATABASES alias")
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or not 1 <= self.max_attempts <= 2**31 - 1
        ):
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['max_attempts'] must be a whole number >= 1")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        args, kwargs, text = encoded_arguments(task, args, kwargs, self.alias)
        connection = connections[self.database]
        if connection.vendor != "postgresql":
            raise InvalidTaskBackend(
                f"jobsup.django.JobsupBackend needs PostgreSQL; DATABASES[{self.database!r}] is {connection.vendor}"
            )
        # What the enqueue middleware see: the job as jobsup stores it (the payload's arguments as they
        # will be passed). They run before the insert, as every enqueue's do.
        spec = JobSpec(
            kind=task.module_path,
            payload={"args": args, "kwargs": kwargs, "backend": self.alias},
            queue=task.queue_name,
            priority=task.priority,
            run_at=task.run_after,
            max_attempts=self.max_attempts,
        )
        spec = middleware.stamp(spec, self._enqueue_app())
        with connection.cursor() as cursor:
            cursor.execute(
                SQL["enqueue"],
                {
                    "queue": spec.queue,
                    "kind": spec.kind,
                    "payload": text,
                    "priority": spec.priority,
                    "run_at": spec.run_at,
                    "delay": 0.0,
                    "max_attempts": spec.max_attempts,
                    "unique_key": None,
                    "key": None,
                    "meta": spec.encoded_meta(),
                },
            )
            job_id, created_at = one_row(cursor.fetchone(), "enqueue")
        result: TaskResult[..., Any] = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def _enqueue_app(self) -> App | None:
        """The App of OPTIONS["app"], imported the first time a task is enqueued (settings are read before
        the modules an App's handlers import can be)."""
        if self._app is None and self.app_target is not None:
            try:
                self._app = load_app(self.app_target)
            except AppNotFound as exc:
                raise InvalidTaskBackend(f"TASKS[{self.alias!r}]['OPTIONS']['app']: {exc}") from exc
        return self._app

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(f"{result_id!r} is not the id of a jobsup task result") from None
        with connections[self.database].cursor() as cursor:
            cursor.execute(SQL["task_result"], {"id": job_id})
            row = cursor.fetchone()
        if row is None:
            raise TaskResultDoesNotExist(f"no task result {result_id!r}")
        return self._result(row)

    def _result(self, row: tuple) -> TaskResult:
        (
            job_id,
            kind,
            queue,
            payload,
            status,
            priority,
            attempts,
            run_at,
            created_at,
            started_at,
            done_at,
            locked_by,
            errors,
            return_value,
        ) = row
        payload, errors = _json(payload), _json(errors)
        if not (isinstance(payload, dict) and set(payload) == _PAYLOAD_KEYS):
            raise TaskResultDoesNotExist(f"job {job_id} is a jobsup job of kind {kind!r}, not a Django task")
        found = imported(kind)
        if not isinstance(found, Task):
            raise TaskResultDoesNotExist(
                f"job {job_id} is a jobsup job of kind {kind!r}, not a Django task: it is a {type(found).__name__}"
            )
        task = found
        try:  # the task as it was enqueued; Task.get_result compares only its function
            task = task.using(
                priority=priority,
                queue_name=queue,
                backend=payload["backend"],
                run_after=run_at if run_at > created_at else None,
            )
        except InvalidTask:
            pass  # a queue or backend the settings no longer accept: the task as it is declared now
        result: TaskResult[..., Any] = TaskResult(
            task=task,
            id=str(job_id),
            status=STATUS[status],
            enqueued_at=created_at,
            started_at=started_at,
            finished_at=done_at,
            last_attempted_at=started_at,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=payload["backend"],
            errors=[task_error(e) for e in errors],
            worker_ids=worker_ids(attempts, errors, locked_by),
        )
        if status == "done":
            object.__setattr__(result, "_return_value", _json(return_value))
        return result

    # A list, the return type django-stubs gives the base's check (Django only iterates it).
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        vendor = connections[self.database].vendor if self.database in connections else None
        if vendor == "postgresql":
            return []
        return [
            checks.Error(
                f"TASKS[{self.alias!r}] uses jobsup.django.JobsupBackend, which needs a "
                f"PostgreSQL database; DATABASES[{self.database!r}] is {vendor or 'not set'}",
                id="jobsup.E001",
            )
        ]


def encoded_arguments(task: Task, args: Any, kwargs: Any, alias: str) -> tuple[list, dict, str]:
    """The arguments normalized as the framework's backends normalize them (bytes to text, any sequence
    to a list: TaskResult does it too), and the payload's JSON text; InvalidArguments saying why not."""
    subject = f"the arguments of task {task.module_path}"
    try:
        args, kwargs = normalize_json(args), normalize_json(kwargs)
    except (TypeError, ValueError) as exc:
        # json's words for a type it refuses too: "Object of type datetime is not JSON serializable", the
        # TypeError Django's documentation shows; normalize_json's own else (bytes that are not UTF-8).
        reason = (_json_refusal(args, kwargs) if isinstance(exc, TypeError) else None) or str(exc)
        raise InvalidArguments(f"{subject} are not JSON: {reason}") from None
    payload = {"args": args, "kwargs": kwargs, "backend": alias}
    try:
        return args, kwargs, encoded_json(payload, subject, error=InvalidArguments)
    except InvalidArguments as exc:
        # encoded_json words its reasons for one value ("is not JSON", "holds a NUL"); these are several.
        message = str(exc)
        for one, several in ((" is ", " are "), (" holds ", " hold ")):
            if message.startswith(subject + one):
                message = subject + several + message[len(subject + one) :]
        raise InvalidArguments(message) from None


def _json_refusal(*values: Any) -> str | None:
    try:
        json.dumps(values)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def _json(value: Any) -> Any:
    # Django reads jsonb as text (JSONField decodes it itself); a plain psycopg cursor decodes it.
    return json.loads(value) if isinstance(value, str) else value


def imported(kind: str) -> Any:
    """What the module path `kind` names, imported; ImportError naming it when it cannot be."""
    try:
        return import_string(kind)
    except Exception as exc:  # the module itself may raise anything while it imports
        raise ImportError(f"task {kind} cannot be imported: {type(exc).__name__}: {exc}") from exc


def find_task(kind: str) -> Task:
    """The Task whose module path is `kind`, imported; ImportError naming it, or NoHandler if that is
    not a task."""
    found = imported(kind)
    if not isinstance(found, Task):
        raise NoHandler(f"no handler for {kind}: it is a {type(found).__name__}, not a Django task")
    return found


def task_error(entry: dict) -> TaskError:
    """A TaskError from one entry of jobs.errors ({attempt, at, error, traceback, by}).

    >>> task_error({"error": "KeyError: 'x'", "traceback": "Traceback ...\\nKeyError: 'x'\\n"})
    TaskError(exception_class_path='builtins.KeyError', traceback="Traceback ...\\nKeyError: 'x'\\n")
    >>> task_error({"error": "timed out after 30s"}).exception_class_path
    'jobsup.django.AttemptLost'
    """
    error, tb = entry.get("error") or "", entry.get("traceback")
    if not tb:
        return TaskError(exception_class_path=f"{__name__}.AttemptLost", traceback=error)
    return TaskError(exception_class_path=exception_path(error, tb), traceback=tb)


def exception_path(error: str, tb: str) -> str:
    """The exception class path of a failed attempt, read from its traceback: the line naming the
    exception of `error` (the worker's "Name: message"), else the last line that names one.

    >>> exception_path("ValueError: bad", "Traceback...\\nValueError: bad\\nsecond line")
    'builtins.ValueError'
    >>> exception_path("Boom: x", "Traceback...\\nshop.errors.Boom: x")
    'shop.errors.Boom'
    >>> exception_path("handler called sys.exit(3)", "Traceback...\\nSystemExit: 3")
    'builtins.SystemExit'
    """
    name = error.split(":", 1)[0].strip()
    lines = tb.rstrip().splitlines()[::-1]
    named = [m.group(1) for m in map(_EXCEPTION_LINE.match, lines) if m]
    path = next((p for p in named if p == name or p.endswith("." + name)), named[0] if named else "Exception")
    return path if "." in path else f"builtins.{path}"


def worker_ids(attempts: int, errors: list[dict], locked_by: str | None) -> list[str]:
    """One id per attempt (TaskResult.attempts is their count): the supervisor that recorded that
    attempt's failure, or the one holding it now (or that completed it).

    >>> worker_ids(2, [{"attempt": 1, "by": "h:1:aa"}], "h:2:bb")
    ['h:1:aa', 'h:2:bb']
    """
    by = {e.get("attempt"): e.get("by") for e in errors}
    return [by.get(n) or locked_by or "" for n in range(1, attempts + 1)]


def database(dsn: str | None = None) -> dict[str, Any]:
    """A DATABASES entry for the database jobsup uses: `dsn`, else JOBSUP_DSN, else DATABASE_URL, else
    the embedded PostgreSQL (started if need be), as every jobsup command resolves it."""
    from psycopg import conninfo

    from jobsup.db.dsn import resolve

    params = conninfo.conninfo_to_dict(resolve(dsn))
    user = params.pop("user", "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.pop("dbname", user or "postgres"),
        "USER": user,
        "PASSWORD": params.pop("password", ""),
        "HOST": params.pop("host", ""),
        "PORT": params.pop("port", ""),
        "OPTIONS": params,  # sslmode and the like, passed to psycopg
    }


# --- the workers' side ------------------------------------------------------------------------------


class TaskApp(App):
    """What a worker of `jobsup start --django` runs: the handlers of --app if one is given, and every
    Django task, found by its module path the first time this worker sees it."""

    finds_kinds = True

    def __init__(self, base: App | None = None) -> None:
        super().__init__()
        if base is not None:
            self.handlers.update(base.handlers)
            self.middleware = base.middleware

    def get(self, kind: str) -> Handler:
        handler = self.handlers.get(kind)
        return handler if handler is not None else Handler(kind, _runner(find_task(kind)))


def worker_app(settings_module: str, app_target: str | None = None) -> TaskApp:
    """Set up Django once for this worker process (django.setup()) and return its TaskApp; AppNotFound
    saying why when the settings cannot be loaded."""
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    try:
        django.setup()
    except Exception as exc:
        raise AppNotFound(
            f"cannot set up Django with settings {settings_module!r} (from --django): {type(exc).__name__}: {exc}"
        ) from exc
    return TaskApp(load_app(app_target) if app_target else None)


def _runner(task: Task) -> Callable[[Job], Any]:
    # A sync task's function is called directly (Task.call would ask each time whether it is a
    # coroutine function); an async one goes through Task.call, which runs it with async_to_sync as the
    # framework's own backends do, so the ORM calls it makes through sync_to_async work as in a view.
    call = task.call if iscoroutinefunction(task.func) else task.func

    def run(job: Job) -> Any:
        # As Django does at the start of each request: a connection that broke or outlived CONN_MAX_AGE
        # (0 by default: every one) is closed, not handed to this task. Once per task, not also after it:
        # the check walks every configured database (27 us on a loaded 2-core machine), and the next
        # task's check closes what this one left, as the next request's would.
        close_old_connections()
        args, kwargs, alias = job.payload["args"], job.payload["kwargs"], job.payload["backend"]
        if task.takes_context:  # the context's result is the row as get_result reads it
            backend = task_backends[alias]
            result = backend.get_result(str(job.id))
            sender = type(backend)
        else:  # built from the job, sparing each task a query
            result, sender = running_result(task, job), _sender(alias)
        # As the framework's own backends send them: started just before the task runs, finished with its
        # outcome (from inside the except, so a receiver that logs with logger.exception has it).
        task_started.send(sender=sender, task_result=result)
        try:
            if task.takes_context:
                value = call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = call(*args, **kwargs)
            value = None if value is None else normalize_json(value)  # what the framework accepts
        except BaseException as exc:
            object.__setattr__(result, "finished_at", timezone.now())
            path = f"{type(exc).__module__}.{type(exc).__qualname__}"
            result.errors.append(
                TaskError(exception_class_path=path, traceback="".join(traceback.format_exception(exc)))
            )
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            task_finished.send(sender=sender, task_result=result)
            raise
        object.__setattr__(result, "finished_at", timezone.now())
        object.__setattr__(result, "_return_value", value)
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        task_finished.send(sender=sender, task_result=result)
        return value

    return run


def running_result(task: Task, job: Job) -> TaskResult:
    """The TaskResult of the attempt `job` is, RUNNING, from what the worker knows of it (no query): what
    get_result would read, but enqueued_at (None), started_at (now, the worker's clock, rather than the
    claim's) and this attempt's worker id ("")."""
    alias = job.payload["backend"]
    if (task.priority, task.queue_name, task.backend) != (job.priority, job.queue, alias):
        try:  # the task as it was enqueued, as get_result gives it
            task = task.using(priority=job.priority, queue_name=job.queue, backend=alias)
        except InvalidTask:
            pass  # a queue or backend the settings no longer accept: the task as it is declared now
    errors = job.errors or []
    now = timezone.now()
    return TaskResult(
        task=task,
        id=str(job.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=job.payload["args"],
        kwargs=job.payload["kwargs"],
        backend=alias,
        errors=[task_error(e) for e in errors],
        worker_ids=worker_ids(job.attempts, errors, None),
    )


def _sender(alias: str) -> type[BaseTaskBackend]:
    """The class of the backend `alias`: the sender of its signals. JobsupBackend when the settings no
    longer name it, which would not stop its tasks already enqueued from running."""
    try:
        return type(task_backends[alias])
    except InvalidTaskBackend:
        return JobsupBackend
