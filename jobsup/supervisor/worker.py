"""The worker process: it imports the app, then runs one job at a time as the supervisor sends them.

It never talks to the database. It reads ("jobs", [job, ...]) from its pipe (each payload as the JSON
text the claim returned: parsed here, not in the supervisor's one thread), runs them in order and
answers each with ("answer", *Answer): its id, the error and traceback of a failure (None, None when
done), a done job's return value as JSON text, the verb of a handler's Snooze, RetryAfter or Discard,
and the seconds the handler ran, measured here (the supervisor decides from it whether jobs are short
enough to hand out several at a time, and records it as the job's run time; a time taken from its side
would count the trip through the pipes, which a loaded machine stretches to milliseconds). Whatever
kills it instead, the supervisor sees it go at once and records the failed attempt of the job it was
running itself.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from jobsup import middleware
from jobsup.db.json_text import loads
from jobsup.errors import NoHandler, ReturnValueError
from jobsup.job import Job, encoded_json
from jobsup.middleware import RunOutcome
from jobsup.outcomes import MAX_SNOOZES, Answer, Discard, RetryAfter, Snooze

if TYPE_CHECKING:
    from jobsup.app import App
    from jobsup.supervisor.wire import Reader

# How often a worker checks that its supervisor is still there, besides the parent-death signal.
PARENT_CHECK_INTERVAL = 0.5

_PR_SET_PDEATHSIG = 1


def _die_with_parent(supervisor_pid: int) -> None:
    """SIGKILL this process when its parent dies, and watch the supervisor itself as well.

    Under forkserver the parent is the fork server, which exits as soon as the supervisor's end of its
    pipe closes; the watcher thread covers the supervisor dying while the fork server lingers.
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the watcher alone
        pass
    parent = os.getppid()

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(PARENT_CHECK_INTERVAL):
            try:
                os.kill(supervisor_pid, 0)
                alive = os.getppid() == parent
            except ProcessLookupError:
                alive = False
            except PermissionError:
                alive = True
            if not alive:
                os._exit(70)

    threading.Thread(target=watch, name="jobsup-parent-watch", daemon=True).start()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    if isinstance(exc, SystemExit):
        return f"handler called sys.exit({exc.code!r})"
    return f"{name}: {text}" if text else name


def worker_main(
    inbox: Connection,
    outbox: Connection,
    app_target: str,
    supervisor_pid: int,
    app_dir: str,
    django_settings: str = "",
    capacity: int = 1,
    fault_path: str = "",
) -> None:
    # `--app examples.lab:app` names a module of the directory jobsup start runs in, as python -m would.
    if app_dir not in sys.path:
        sys.path.insert(0, app_dir)
    # Ctrl-C and a closed terminal's hangup reach the whole process group; the supervisor decides what
    # they mean. Ignored, then unblocked (the fork server started with them blocked), so what a handler
    # runs in a subprocess sees them ignored, as before, not blocked.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGHUP})
    _die_with_parent(supervisor_pid)
    try:
        _serve(inbox, outbox, app_target, django_settings, capacity, fault_path)
    except BrokenPipeError:
        # The supervisor closed our pipes: stopped while we were starting (an early Ctrl-C), or gone.
        # There is no one left to tell, and a traceback on the operator's terminal would say nothing.
        return


def _load(app_target: str, django_settings: str) -> App:
    from jobsup.app import load_app

    if django_settings:  # jobsup.django imports Django; nothing else in jobsup does
        from jobsup.django import worker_app

        return worker_app(django_settings, app_target or None)
    return load_app(app_target)


class Runner:
    """Runs jobs of an app's handlers, inside its run middleware, and says how each ended (an Answer,
    its run time left to the caller). The worker uses it, and so does jobsup.testing.drain to run jobs
    in the test's own process."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.handlers = {kind: (h.func, h.is_async) for kind, h in app.handlers.items()}
        self.max_snoozes = {
            kind: MAX_SNOOZES if h.max_snoozes is None else h.max_snoozes for kind, h in app.handlers.items()
        }
        self._loop: asyncio.AbstractEventLoop | None = None
        # The process's (tracing) and the app's, outermost first. Empty for most apps: run() then takes
        # the path it took before middleware existed.
        self.middleware = middleware.run_chain(app)
        self.attempt: middleware.Attempt | None = None  # the one running now, for stop()
        self.shared_attempts: dict[int, middleware.Attempt] = {}  # those of shared jobs, for stop()
        self.trace: tuple[str, str] | None = None  # (trace id, span id) of the last run, if traced

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:  # one loop for every async handler this runner runs
            self._loop = asyncio.new_event_loop()
        return self._loop

    loop = _async_loop  # the worker's one event loop: async jobs, shared jobs and the start hooks run on it

    def handler_of(self, kind: str) -> tuple[Any, bool] | None:
        """(function, is it async) of `kind`'s handler, or None if the app has none."""
        if kind not in self.handlers:
            try:
                handler = self.app.get(kind)
            except NoHandler:
                return None
            self.handlers[kind] = (handler.func, handler.is_async)
        return self.handlers[kind]

    # --- jobs that share the process (jobsup.supervisor.sharing) -----------------------------------

    def run_traced(self, job: Job) -> tuple[Answer, tuple[str, str] | None]:
        """run() for a sync job in one of the worker's threads: its answer and its trace."""
        if not self.middleware:
            return self.run(job), None
        attempt = middleware.Attempt(self.middleware, job)
        self.shared_attempts[job.id] = attempt
        try:
            answer = self._through(job, attempt, self._handled)
        finally:
            self.shared_attempts.pop(job.id, None)
            attempt.close()
        return answer, attempt.trace

    async def arun(self, job: Job, stopping: dict[int, tuple[str, str]]) -> tuple[Answer, tuple[str, str] | None]:
        """An async job as a task of the worker's loop: its answer and its trace. A cancelled task (its
        timeout, an operator's cancel: `stopping` says which) tells its middleware why."""
        if not self.middleware:
            try:
                value = await self._acall(job)
                return Answer(job.id, value=None if value is None else _encoded(job, value)), None
            except BaseException as exc:
                return self._failed(job, exc), None
        attempt = middleware.Attempt(self.middleware, job)
        self.shared_attempts[job.id] = attempt
        try:
            failure = attempt.enter()
            if failure is None:
                try:
                    value = await self._acall(job)
                    text = None if value is None else _encoded(job, value)
                    answer, outcome = Answer(job.id, value=text), RunOutcome("done", value=value)
                except BaseException as exc:
                    answer = self._failed(job, exc)
                    outcome = _outcome_of(answer, exc)
                    if isinstance(exc, asyncio.CancelledError) and job.id in stopping:
                        status, reason = stopping[job.id]
                        outcome = RunOutcome(status, error=middleware.AttemptStopped(reason))
            else:
                answer, outcome = self._middleware_failed(job, *failure, None)
            answer = self._leave(job, attempt, answer, outcome)
        finally:
            self.shared_attempts.pop(job.id, None)
            attempt.close()
        return answer, attempt.trace

    async def _acall(self, job: Job) -> Any:
        # Only the jobs of async handlers run as tasks (sharing.Shared.start found theirs).
        func, _ = self.handlers[job.kind]
        return await func(job)

    def run(self, job: Job) -> Answer:
        if self.middleware:
            return self._run_wrapped(job)
        try:
            value = self._call(job)
            if value is not None:
                value = _encoded(job, value)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: one failed attempt
            return self._failed(job, exc)
        return Answer(job.id, value=value)

    def _call(self, job: Job) -> Any:  # what the handler returned
        kind = job.kind
        if kind in self.handlers:
            func, is_async = self.handlers[kind]
        else:  # an app that finds kinds by name (Django's) imports it now, once per worker
            handler = self.app.get(kind)
            func, is_async = self.handlers[kind] = (handler.func, handler.is_async)
        return self._async_loop().run_until_complete(func(job)) if is_async else func(job)

    def _failed(self, job: Job, exc: BaseException) -> Answer:
        """The Answer of an attempt that raised `exc` (the handler, or a middleware as if it were it)."""
        if isinstance(exc, NoHandler):
            return Answer(job.id, str(exc))
        if isinstance(exc, Snooze):
            most = self.max_snoozes.get(job.kind, MAX_SNOOZES)
            if job.snoozes >= most:  # a cap, so a job cannot snooze for ever unnoticed
                return Answer(
                    job.id,
                    f"Snooze: snoozed {job.snoozes} times, the most a {job.kind!r} job may (max_snoozes={most})",
                )
            return Answer(job.id, f"Snooze: {exc}", verb=("snooze", exc.seconds))
        if isinstance(exc, RetryAfter):
            return Answer(job.id, _describe(exc), _traceback(exc), verb=("retry", exc.seconds))
        if isinstance(exc, Discard):
            return Answer(job.id, _describe(exc), verb=("discard",))
        return Answer(job.id, _describe(exc), _traceback(exc))

    # --- with run middleware (jobsup.middleware) ---------------------------------------------------

    def _run_wrapped(self, job: Job) -> Answer:
        attempt = self.attempt = middleware.Attempt(self.middleware, job)
        try:
            answer = self._through(job, attempt, self._handled)
        finally:
            self.attempt = None
            attempt.close()
        self.trace = attempt.trace
        return answer

    def _through(self, job: Job, attempt: middleware.Attempt, handled: Any) -> Answer:
        """The attempt's middleware entered, `handled(job)` run, the middleware left."""
        failure = attempt.enter()
        if failure is None:
            answer, outcome = handled(job)
        else:
            answer, outcome = self._middleware_failed(job, *failure, None)
        return self._leave(job, attempt, answer, outcome)

    def _leave(self, job: Job, attempt: middleware.Attempt, answer: Answer, outcome: RunOutcome) -> Answer:
        while attempt.started:
            failure = attempt.leave_one(outcome)
            if failure is not None:
                answer, outcome = self._middleware_failed(job, *failure, answer)
        return answer

    def _handled(self, job: Job) -> tuple[Answer, RunOutcome]:
        try:
            value = self._call(job)
            text = None if value is None else _encoded(job, value)
        except BaseException as exc:
            answer = self._failed(job, exc)
            return answer, _outcome_of(answer, exc)
        return Answer(job.id, value=text), RunOutcome("done", value=value)

    def _middleware_failed(
        self, job: Job, name: str, exc: BaseException, before: Answer | None
    ) -> tuple[Answer, RunOutcome]:
        """What middleware `name` raising `exc` makes of the attempt, which had come to `before` (None:
        the handler has not run)."""
        if isinstance(exc, (Snooze, RetryAfter, Discard)):  # as if the handler had raised it
            answer = self._failed(job, exc)
            return answer, _outcome_of(answer, exc)
        error = f"middleware {name}: {_describe(exc)}"
        if before is not None and before.error is not None and before.verb is None:
            # The attempt had failed already: that stays its error, and this one is told after it.
            told = f"{before.traceback or before.error}\nThen {error}\n{_traceback(exc)}"
            return before._replace(traceback=told), RunOutcome("failed", error=exc)
        return Answer(job.id, error, _traceback(exc)), RunOutcome("failed", error=exc)

    def stop(self, status: str, reason: str) -> None:
        """The worker is being stopped while it runs an attempt (a timeout, a cancel, a shutdown): its
        run middleware are left with how it ends. What they raise now is no one's to see."""
        outcome = RunOutcome(status, error=middleware.AttemptStopped(reason))
        for attempt in [self.attempt, *self.shared_attempts.values()]:
            while attempt is not None and attempt.started:
                attempt.leave_one(outcome)


def _encoded(job: Job, value: Any) -> str:
    return encoded_json(value, f"return value of a {job.kind!r} job", error=ReturnValueError)


def _outcome_of(answer: Answer, exc: BaseException) -> RunOutcome:
    """The RunOutcome of an attempt that raised `exc` and came to `answer` (a snooze past max_snoozes is
    a failure)."""
    verb = answer.verb[0] if answer.verb else None
    return RunOutcome({"snooze": "snoozed", "discard": "discarded"}.get(verb or "", "failed"), error=exc)


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc, limit=30))


def job_fields(job: Job) -> tuple[Any, ...]:
    """What the supervisor sends a worker of each job: the fields of Job a handler sees, its payload and
    errors as the JSON text the claims connection returns them as (the worker parses them)."""
    return (
        job.id,
        job.kind,
        job.payload,
        job.queue,
        job.attempts,
        job.max_attempts,
        job.priority,
        job.snoozes,
        job.errors,
        job.key,
        job.meta,
    )


# Payloads, errors and meta come as the JSON text of jsonb columns, read by the C scanner alone.
column_json = loads
_make_job = Job._make


def job_of(fields: tuple) -> Job:
    """The Job a handler sees, from what job_fields() sent of it: its JSON texts read, in Job's order
    (built from a tuple, in a third of the time keywords take)."""
    job_id, kind, payload, queue, attempts, max_attempts, priority, snoozes, errors, key, meta = fields
    return _make_job(
        (
            job_id,
            kind,
            None if payload is None else column_json(payload),
            queue,
            attempts,
            max_attempts,
            priority,
            None,  # run_at, created_at: not sent
            None,
            snoozes,
            column_json(errors) if errors else [],
            None,  # started_at
            key,
            # JSON text from the claims link; a dict from a claim on the writes link (dispatcher.py)
            column_json(meta) if type(meta) is str else meta,
        )
    )


def _serve(
    inbox: Connection, outbox: Connection, app_target: str, django_settings: str, capacity: int, fault_path: str
) -> None:
    from jobsup.errors import JobsupError
    from jobsup.supervisor.wire import Reader, send

    fd = outbox.fileno()
    reader = Reader(inbox.fileno())

    try:
        app = _load(app_target, django_settings)
    except JobsupError as exc:
        send(fd, ("fatal", str(exc)))
        sys.exit(3)
    except BaseException as exc:  # an app whose import raises SystemExit or worse
        send(fd, ("fatal", f"importing {app_target or django_settings} failed: {_describe(exc)}"))
        sys.exit(3)

    runner = Runner(app)
    try:
        run_hooks(runner, app.worker_start)
    except BaseException as exc:
        send(fd, ("fatal", f"a worker start function of {app_target or django_settings} failed: {_describe(exc)}"))
        sys.exit(3)
    handlers = runner.handlers
    timeouts = {kind: h.timeout for kind, h in app.handlers.items() if h.timeout is not None}
    # An app that finds handlers by name (Django's tasks, by module path) handles any kind: None says so,
    # and the supervisor sends every kind here instead of failing unknown ones itself.
    limits = {kind: h.limits.to_json() for kind, h in app.handlers.items() if h.limits.limited}
    # The kinds whose jobs share a process, each with its cap in one process (0: the process's capacity).
    shared = {kind: h.per_process or 0 for kind, h in app.handlers.items() if h.shared}
    send(
        fd,
        (
            "ready",
            os.getpid(),
            None if app.finds_kinds else sorted(handlers),
            timeouts,
            list(app.schedules.values()),
            limits,
            shared,
        ),
    )

    if runner.middleware:
        # Stopped while it runs an attempt, the worker leaves the attempt's run middleware first (a span
        # ends saying it timed out) instead of vanishing in the middle of them; then it ends by the
        # signal as before. Without middleware it dies at once, as it always has.
        signal.signal(signal.SIGTERM, lambda signum, frame: _stopped(runner, reader))

    batch = _Batch(fd)
    signal.signal(signal.SIGUSR1, batch.on_signal)
    sharing = None
    message: tuple | None = None
    while True:
        if message is None:
            try:
                message = reader.read_one()
            except OSError:
                message = None
        if message is None or message[0] == "stop":  # None: the supervisor is gone
            if message is not None:  # a clean stop: what the start functions opened is closed
                run_hooks(runner, app.worker_stop, quiet=True)
            return
        tag = message[0]
        if tag == "shared":
            if sharing is None:
                from jobsup.supervisor.sharing import Shared

                sharing = Shared(runner, partial(send, fd), job_of, capacity, fault_path)
            first = [job_of(fields) for fields in message[1]]
            message = runner.loop().run_until_complete(sharing.serve(reader, first))
            if message is not None and message[0] == "idle":
                message = None
            continue
        if tag == "jobs":
            # Jobs run in the order given, each answered as it ends, so the supervisor always knows which
            # one runs: the first it has no answer for. Those behind a job that turns out slow are given
            # back when the supervisor asks (SIGUSR1, _Batch.recall).
            pending = batch.pending
            pending.extend(message[1])
            batch.asked = False  # a request that came while it was idle was for jobs it has finished
            while pending:
                job = job_of(pending.popleft())
                started = time.perf_counter()
                batch.running = True
                answer = runner.run(job)
                batch.running = False
                ran = time.perf_counter() - started
                if runner.trace is None:
                    send(fd, ("answer", *answer[:-1], ran))
                else:  # the attempt's trace and span, for the supervisor's log lines about it
                    send(fd, ("answer", *answer[:-1], ran, runner.trace))
                if batch.asked:
                    batch.recall()
        # "interrupt": the reason of a SIGTERM for a job it finished meanwhile; "cancel": of a shared job
        # that ended meanwhile
        message = None


class _Batch:
    """The alone jobs a worker was handed together, and giving back those it has not started.

    The supervisor hands short jobs several at a time; when one of them turns out slow, it sends
    SIGUSR1 and the jobs not started yet go back to it (("recalled", [ids])) for a free worker to run.
    The handler does it at once while a job runs (the main loop is then inside the job, not touching
    the batch or the pipe), else it asks the loop to, before the next job starts: either way a job is
    given back or started, never both."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # The jobs not started yet: the loop takes each with popleft, the recall takes the rest (one C
        # call each: a signal between two bytecodes sees one or the other, never a job in both).
        self.pending: deque[tuple[Any, ...]] = deque()
        self.running = False  # a job of the batch runs now
        self.asked = False

    def on_signal(self, signum: int, frame: object) -> None:
        if self.running:
            self.recall()
        else:
            self.asked = True

    def recall(self) -> None:
        from jobsup.supervisor.wire import send

        self.asked = False
        back = [fields[0] for fields in self.pending]
        self.pending.clear()
        send(self.fd, ("recalled", back))


def run_hooks(runner: Runner, hooks: list, quiet: bool = False) -> None:
    """Run the app's worker start (or stop) functions, an async one on the worker's loop. `quiet`: a
    stop function's failure is printed, not raised: the worker is on its way out."""
    for hook in hooks:
        try:
            result = hook()
            if asyncio.iscoroutine(result):
                runner.loop().run_until_complete(result)
        except BaseException:
            if not quiet:
                raise
            traceback.print_exc()


def _stopped(runner: Runner, reader: Reader) -> None:
    """SIGTERM: finish the running attempt's middleware with the reason the keeper sent just before the
    signal (("interrupt", status, reason); none for a SIGTERM from elsewhere), then end by the signal."""
    status, reason = "failed", "the worker received SIGTERM"
    try:
        for message in reader.read_ready():
            if message[0] == "interrupt":
                _, status, reason = message
        runner.stop(status, reason)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
