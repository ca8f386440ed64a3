"""Running a handler: Runner runs a job inside the app's run middleware and says how it ended (an
Answer), and run_hooks runs the app's worker start and stop functions. The worker process runs its jobs
through them (jobsup/worker/main.py, sharing.py), and so does jobsup.testing.drain in the test's own
process."""

from __future__ import annotations

import asyncio
import traceback
from typing import TYPE_CHECKING, Any

from jobsup import middleware
from jobsup.errors import NoHandler, ReturnValueError
from jobsup.job import Job, encoded_json
from jobsup.middleware import RunOutcome
from jobsup.outcomes import MAX_SNOOZES, Answer, Discard, RetryAfter, Snooze

if TYPE_CHECKING:
    from jobsup.app import App


def describe(exc: BaseException) -> str:
    """What an exception is called in an attempt's error: its type and the first line of its text."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    if isinstance(exc, SystemExit):
        return f"handler called sys.exit({exc.code!r})"
    return f"{name}: {text}" if text else name


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

    # --- jobs that share the process (jobsup.worker.sharing) -----------------------------------

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
            return Answer(job.id, describe(exc), _traceback(exc), verb=("retry", exc.seconds))
        if isinstance(exc, Discard):
            return Answer(job.id, describe(exc), verb=("discard",))
        return Answer(job.id, describe(exc), _traceback(exc))

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
        error = f"middleware {name}: {describe(exc)}"
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
