"""The handler registry: `app = App()`, `@app.handler("email", max_attempts=5, timeout=30)`."""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Unpack

import psycopg

from jobsup import client
from jobsup.errors import AppNotFound, BadInput, NoHandler
from jobsup.job import EncodedPayload, EnqueueOptions, Job, JobSpec, make_spec
from jobsup.limits import Limits, check_key
from jobsup.middleware import EnqueueMiddleware, Middleware, RunMiddleware
from jobsup.schedule import DEFAULT_MISSED_LIMIT, Schedule
from jobsup.workflow import Workflow

HandlerFunc = Callable[[Job], Any]
KeyFunc = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Handler:
    kind: str
    func: HandlerFunc
    max_attempts: int | None = None  # default for jobs of this kind enqueued through the app
    timeout: float | None = None  # seconds; None means the supervisor's --timeout
    queue: str | None = None
    priority: int | None = None
    max_snoozes: int | None = None  # None: jobsup.outcomes.MAX_SNOOZES
    limits: Limits = Limits()  # what this app declares for the kind; the database holds what is in force
    key: KeyFunc | None = None  # a job's key from its payload, when the enqueue gives none
    # Its jobs may share a worker process with other shared jobs (async handlers as tasks on the
    # worker's event loop, sync ones in its threads); False: each runs alone in a process.
    shared: bool = False
    # The most of this kind's jobs one process runs at once (shared handlers only); None: --capacity.
    per_process: int | None = None

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.func)

    def key_of(self, spec: JobSpec) -> str:
        """The key the handler's key function computes from the payload of `spec`, or BadInput naming
        the handler: a key function that raises or returns anything but a string is an enqueue's error,
        not a job that fails later."""
        assert self.key is not None
        payload = spec.payload
        if type(payload) is EncodedPayload:  # the CLI's, as JSON text
            payload = json.loads(payload)
        try:
            key = self.key({} if payload is None else payload)
        except Exception as exc:
            raise BadInput(f"the key function of handler {self.kind!r} raised {type(exc).__name__}: {exc}") from None
        if not isinstance(key, str):
            raise BadInput(
                f"the key function of handler {self.kind!r} returned {type(key).__name__} {key!r}, not a string"
            )
        return check_key(key, self.kind)


class App:
    """The handlers a supervisor's workers run, by kind."""

    # True for an app whose get() finds handlers of kinds never registered (Django's tasks, by module
    # path): its workers are sent every kind, rather than the supervisor failing unknown ones itself.
    finds_kinds = False

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}
        self.schedules: dict[str, Schedule] = {}
        self.middleware = Middleware()
        # Run once in each worker process: after the app is imported, before its first job (start), and
        # when it exits cleanly (stop). Sync functions or coroutine functions (run on the worker's loop).
        self.worker_start: list[Callable[[], Any]] = []
        self.worker_stop: list[Callable[[], Any]] = []

    def on_worker_start(self, func: Callable[[], Any]) -> Callable[[], Any]:
        """Register `func()` (sync or async) to run once in every worker process, after the app is
        imported and before its first job: the place for what each process opens once (a database
        pool, an HTTP client, a tracer provider), rather than the app module, which every process that
        imports it (a web server, a test) runs too. An async one runs on the worker's event loop, the
        one that shared async jobs run on. A start function that raises stops the worker from starting."""
        if not callable(func):
            raise BadInput(f"on_worker_start takes a function, not {func!r}")
        self.worker_start.append(func)
        return func

    def on_worker_stop(self, func: Callable[[], Any]) -> Callable[[], Any]:
        """Register `func()` (sync or async) to run when a worker process exits cleanly (recycled, or
        stopped by a graceful shutdown): close what on_worker_start opened. A worker that is killed
        (a crash, a timeout, a hard stop) runs none."""
        if not callable(func):
            raise BadInput(f"on_worker_stop takes a function, not {func!r}")
        self.worker_stop.append(func)
        return func

    def enqueue_middleware(self, func: EnqueueMiddleware) -> EnqueueMiddleware:
        """Register `func(spec, meta)`, called for every job enqueued through this app (its enqueue
        functions, a Queue or Workflow given it), in the enqueuing process, before the job is written:
        what it puts in `meta` is stored with the job, as `job.meta`. Several run in the order they were
        registered. See jobsup.middleware."""
        return self.middleware.add_enqueue(func)

    def run_middleware(self, func: RunMiddleware) -> RunMiddleware:
        """Register a generator function `func(job)` around every run of this app's handlers, in the
        worker: its code before `outcome = yield` runs before the handler, the rest after it, with the
        RunOutcome. Several wrap in the order they were registered, the first outermost. See
        jobsup.middleware."""
        return self.middleware.add_run(func)

    def handler(
        self,
        kind: str,
        *,
        max_attempts: int | None = None,
        timeout: float | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_snoozes: int | None = None,
        concurrency: int | None = None,
        rate: str | None = None,
        burst: int | None = None,
        key: KeyFunc | None = None,
        key_concurrency: int | None = None,
        key_rate: str | None = None,
        key_burst: int | None = None,
        shared: bool = False,
        per_process: int | None = None,
    ) -> Callable[[HandlerFunc], HandlerFunc]:
        """Register the handler of `kind`. Its limits hold across every supervisor: at most
        `concurrency` of its jobs held at once, at most `rate` started ("100/s", "50/m"; `burst` at
        once), and the same per key (`key_concurrency`, `key_rate`, `key_burst`), a job's key being
        what its enqueue gives (key="account-42") or what `key` computes from its payload.

        `shared=True` lets its jobs share a worker process with other shared jobs (up to the
        supervisor's --capacity at once; `per_process` caps this kind's share of one process): async
        handlers run as tasks on the worker's event loop, sync ones in its threads. For jobs that wait
        (HTTP calls, mail, payment APIs). Without it each job runs alone in a process, as a CPU-bound or
        crash-prone handler should. `per_process` counts in one process; `concurrency` counts across
        every supervisor."""
        if not isinstance(kind, str) or not kind:
            raise BadInput("a handler needs a kind: a non-empty string")
        if max_snoozes is not None and (
            isinstance(max_snoozes, bool) or not isinstance(max_snoozes, int) or max_snoozes < 0
        ):
            raise BadInput(f"max_snoozes of handler {kind!r} must be a whole number >= 0, not {max_snoozes!r}")
        if kind in self.handlers:
            raise BadInput(f"two handlers for kind {kind!r}")
        limits = Limits.of(
            kind,
            concurrency=concurrency,
            rate=rate,
            burst=burst,
            key_concurrency=key_concurrency,
            key_rate=key_rate,
            key_burst=key_burst,
        )
        if key is not None and not callable(key):
            raise BadInput(f"key of handler {kind!r} must be a function of the payload, not {key!r}")
        if not isinstance(shared, bool):
            raise BadInput(f"shared of handler {kind!r} is True or False, not {shared!r}")
        if per_process is not None:
            if isinstance(per_process, bool) or not isinstance(per_process, int) or per_process < 1:
                raise BadInput(f"per_process of handler {kind!r} must be a whole number >= 1, not {per_process!r}")
            if not shared:
                raise BadInput(f"per_process of handler {kind!r} caps jobs that share a process: add shared=True")

        def register(func: HandlerFunc) -> HandlerFunc:
            self.handlers[kind] = Handler(
                kind,
                func,
                max_attempts,
                timeout,
                queue,
                priority,
                max_snoozes,
                limits=limits,
                key=key,
                shared=shared,
                per_process=per_process,
            )
            return func

        return register

    def every(
        self,
        kind: str,
        spec: str | float | timedelta,
        *,
        name: str | None = None,
        tz: str = "UTC",
        payload: dict[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        missed: str = "latest",
        missed_limit: int = DEFAULT_MISSED_LIMIT,
    ) -> Schedule:
        """Enqueue a `kind` job on a schedule: `spec` is a cron expression ("0 3 * * *", "@daily") read
        in `tz`, or an interval ("30s", 30, timedelta). Every supervisor of this app takes part, and each
        fire is enqueued once however many run. `missed` says what a supervisor starting after fires
        that no one enqueued does: "latest" (the most recent one), "none", or "all" (the most recent
        `missed_limit`). Unset queue, priority and max_attempts take the handler's defaults."""
        if isinstance(spec, timedelta):
            spec = spec.total_seconds()
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = f"{spec:g}s" if spec > 0 else f"{spec:g}"  # zero and negatives are refused below
        name = kind if name is None else name
        if name in self.schedules:
            raise BadInput(f"schedule {name!r}: two schedules with this name (give one name=...)")
        defaults = self.spec(kind)
        schedule = Schedule(
            name=name,
            kind=kind,
            # A bool is left unconverted above (an int to Python, but no interval): Schedule refuses it.
            expression=spec,  # type: ignore[arg-type]
            tz=tz,
            payload=payload,
            queue=defaults.queue if queue is None else queue,
            priority=defaults.priority if priority is None else priority,
            max_attempts=defaults.max_attempts if max_attempts is None else max_attempts,
            missed=missed,
            missed_limit=missed_limit,
        )
        self.schedules[name] = schedule
        return schedule

    def get(self, kind: str) -> Handler:
        try:
            return self.handlers[kind]
        except KeyError:
            raise NoHandler(f"no handler for {kind}") from None

    def spec(
        self, kind: str | JobSpec | Mapping[str, Any], payload: Any = None, options: Mapping[str, Any] | None = None
    ) -> JobSpec:
        """A JobSpec whose unset options take the defaults its handler was registered with."""
        name = kind.get("kind") if isinstance(kind, Mapping) else kind
        spec = make_spec(kind, payload, options, self.defaults(name) if isinstance(name, str) else {})
        handler = self.handlers.get(spec.kind)
        if handler is not None and handler.key is not None and spec.key is None:
            spec = replace(spec, key=handler.key_of(spec))
        return spec

    def defaults(self, kind: str) -> dict[str, Any]:
        """The options the handler of `kind` sets (max_attempts, queue, priority); {} for no handler."""
        handler = self.handlers.get(kind)
        if handler is None:
            return {}
        return {
            option: getattr(handler, option)
            for option in ("max_attempts", "queue", "priority")
            if getattr(handler, option) is not None
        }

    def refuse_unknown_kind(self, kind: str, elsewhere: str = "jobsup.enqueue(conn, ...)") -> None:
        """BadInput for a kind this app has no handler for, with the closest one it may mean.

        A supervisor of this app leaves such a job queued forever (another app's supervisor may serve
        it), so a typo would wait unseen: the app's own enqueue refuses it. Only an app that knows all
        its kinds refuses: not one without handlers (a Queue without an app) nor one that finds kinds
        by name (Django's). `elsewhere` says how to enqueue a kind another app handles.
        """
        if not self.handlers or self.finds_kinds or kind in self.handlers:
            return
        close = difflib.get_close_matches(kind, self.handlers, n=1)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
        else:  # nothing like it: name what there is, or the first few of a large app
            kinds = sorted(self.handlers)
            hint = f" (its kinds: {', '.join(kinds[:8])}{', ...' if len(kinds) > 8 else ''})"
        raise BadInput(
            f"the app has no handler for kind {kind!r}{hint}; to enqueue a kind another app handles, use {elsewhere}"
        )

    def _known_spec(
        self, kind: str | JobSpec | Mapping[str, Any], payload: Any = None, options: Mapping[str, Any] | None = None
    ) -> JobSpec:
        spec = self.spec(kind, payload, options)
        self.refuse_unknown_kind(spec.kind)
        return spec

    def workflow(self, name: str | None = None, *, on_parent_failure: str = "cancel") -> Workflow:
        """A Workflow whose jobs take this app's handler defaults (and must be kinds it handles)."""
        return Workflow(name, app=self, on_parent_failure=on_parent_failure)

    def enqueue(
        self, conn: psycopg.Connection[Any], kind: str | JobSpec, payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> int | None:
        """jobsup.enqueue, with this app's handler defaults for what the call leaves out; a kind the app
        has no handler for is refused (BadInput)."""
        return client.enqueue_spec(conn, self._known_spec(kind, payload, options), self)

    async def aenqueue(
        self,
        conn: psycopg.AsyncConnection[Any],
        kind: str | JobSpec,
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> int | None:
        return await client.aenqueue_spec(conn, self._known_spec(kind, payload, options), self)

    def enqueue_many(
        self, conn: psycopg.Connection[Any], jobs: Iterable[JobSpec | Mapping[str, Any]]
    ) -> list[int | None]:
        return client.enqueue_specs(conn, [self._known_spec(job) for job in jobs], self)

    async def aenqueue_many(
        self, conn: psycopg.AsyncConnection[Any], jobs: Iterable[JobSpec | Mapping[str, Any]]
    ) -> list[int | None]:
        return await client.aenqueue_specs(conn, [self._known_spec(job) for job in jobs], self)


def split_target(target: str) -> tuple[str, str]:
    """The module and attribute of `module:attribute`, or AppNotFound (bad input, exit 2) for a string
    of another form: `jobsup start` checks this before it starts anything.

    >>> split_target("examples.lab:app")
    ('examples.lab', 'app')
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not all(part.isidentifier() for part in module_name.split(".")) or not attr.isidentifier():
        raise AppNotFound(f"--app must look like module:attribute (e.g. examples.lab:app), not {target!r}")
    return module_name, attr


def load_app(target: str) -> App:
    """The App named by `module:attribute`, or AppNotFound saying what is wrong."""
    module_name, attr = split_target(target)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time error of the user's module is theirs to see
        raise AppNotFound(f"cannot import {module_name!r} (from --app {target}): {type(exc).__name__}: {exc}") from exc
    try:
        app = getattr(module, attr)
    except AttributeError:
        raise AppNotFound(f"module {module_name!r} has no attribute {attr!r} (from --app {target})") from None
    if not isinstance(app, App):
        raise AppNotFound(f"{target} is a {type(app).__name__}, not a jobsup App")
    return app
