"""Middleware: an app's own code around every enqueue and every run of its jobs.

    @app.enqueue_middleware
    def tenant(spec: JobSpec, meta: dict) -> None:
        meta["tenant"] = current_tenant()          # stored with the job: job.meta in every run

    @app.run_middleware
    def tenant_context(job: Job):
        token = TENANT.set(job.meta["tenant"])     # before the handler
        try:
            outcome = yield                        # the handler runs here; how it ended comes back
        finally:
            TENANT.reset(token)                    # after it

An enqueue middleware is called once per job, in the enqueuing process, before the job is written; what
it puts in `meta` is stored with the job (jobs.meta, MAX_META_BYTES of JSON at most). A run middleware is
a generator function: its code before the `yield` runs before the handler, in the worker, and its code
after it runs after the handler, with a RunOutcome. One shape wraps sync and async handlers alike, and
context it sets (a contextvar, a current span) is the handler's. Middleware run in the order they were
registered, the first outermost; tracing (jobsup.otel), when on, is outside them all.

What a run middleware raises counts as if the handler raised it (Snooze, RetryAfter and Discard included),
except that the error of an ordinary exception names the middleware: "middleware tenant_context:
KeyError: 'tenant'". Before the handler, it stops the attempt there (the handler and the middleware
inside it do not run; those outside it see the failure). After the handler, it fails an attempt that
had not failed; a failure of the handler stays the attempt's error, with the middleware's added to its
traceback. An enqueue middleware's exception is the enqueue's: nothing is written.

This module imports nothing beyond jobsup's ground modules and jobsup.otel (which imports opentelemetry
only once tracing is turned on): every enqueue and every run passes here. It takes an app as anything
with a `middleware` (HasMiddleware), so that jobsup.app, above it, imports it and not the reverse.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from jobsup import otel
from jobsup.errors import BadInput
from jobsup.job import Job, JobSpec

# RunOutcome and AttemptStopped are defined beside the other outcomes, which jobsup.otel reads too; this
# module's names for them stay, as the run middleware's own.
from jobsup.outcomes import STATUSES as STATUSES
from jobsup.outcomes import AttemptStopped as AttemptStopped
from jobsup.outcomes import RunOutcome as RunOutcome

EnqueueMiddleware = Callable[[JobSpec, dict[str, Any]], None]
RunMiddleware = Callable[[Job], Generator[None, RunOutcome, None]]


def name_of(func: Callable[..., Any]) -> str:
    """The name a middleware's failure is reported under.

    >>> def tenant_context(job): yield
    >>> name_of(tenant_context)
    'tenant_context'
    """
    return getattr(func, "__name__", None) or repr(func)


@dataclass
class Middleware:
    """The middleware of an app (or of the process), each with its name, in the order they run."""

    enqueue: list[tuple[str, EnqueueMiddleware]] = field(default_factory=list)
    run: list[tuple[str, RunMiddleware]] = field(default_factory=list)

    def add_enqueue(self, func: EnqueueMiddleware) -> EnqueueMiddleware:
        if not callable(func):
            raise BadInput(f"an enqueue middleware is a function of (spec, meta), not {func!r}")
        self.enqueue.append((name_of(func), func))
        return func

    def add_run(self, func: RunMiddleware) -> RunMiddleware:
        if not inspect.isgeneratorfunction(func):
            raise BadInput(
                f"run middleware {name_of(func)} must be a generator function: "
                "def mw(job): ...before...; outcome = yield; ...after..."
            )
        self.run.append((name_of(func), func))
        return func


class HasMiddleware(Protocol):
    """What this module needs of an app (jobsup.app.App): its middleware."""

    @property
    def middleware(self) -> Middleware: ...


# --- the process's own middleware: tracing ---------------------------------------------------------

_process: Middleware | None = None
# What turns tracing on for a process from its environment (jobsup.otel).
OTEL_ENV = "JOBSUP_OTEL"
_TRUE = ("1", "true", "yes", "on")


def traced_by_env() -> bool:
    """Whether this process's environment turns tracing on (JOBSUP_OTEL)."""
    return os.environ.get(OTEL_ENV, "").strip().lower() in _TRUE


def process() -> Middleware:
    """The middleware of every enqueue and every run of this process, whatever the app: jobsup.otel's,
    once tracing is on (its lists, which instrument() fills). JOBSUP_OTEL is read on first use, so a
    process without it imports nothing more."""
    global _process
    if _process is None:
        _process = Middleware(enqueue=otel.ENQUEUE, run=otel.RUN)
        if traced_by_env():
            _instrument_from_env()
    return _process


def _instrument_from_env() -> None:
    try:
        otel.instrument()
    except ImportError as exc:
        # An environment variable must not turn every enqueue into an error: say it once, and go on.
        warnings.warn(f"{OTEL_ENV} is set, but {exc}: jobs are not traced", RuntimeWarning, stacklevel=3)


# --- enqueue -------------------------------------------------------------------------------------------


def _enqueue_chain(app: HasMiddleware | None) -> list[tuple[str, EnqueueMiddleware]]:
    chain = process().enqueue
    if app is not None and app.middleware.enqueue:
        chain = chain + app.middleware.enqueue
    return chain


def stamp(spec: JobSpec, app: HasMiddleware | None) -> JobSpec:
    """`spec` with the meta that the process's and `app`'s enqueue middleware give it."""
    chain = _enqueue_chain(app)
    return _stamped(spec, chain) if chain else spec


def stamp_all(specs: Iterable[JobSpec], app: HasMiddleware | None) -> list[JobSpec]:
    chain = _enqueue_chain(app)
    return [_stamped(spec, chain) for spec in specs] if chain else list(specs)


def _stamped(spec: JobSpec, chain: list[tuple[str, EnqueueMiddleware]]) -> JobSpec:
    meta: dict[str, Any] = dict(spec.meta) if spec.meta else {}
    for _, func in chain:
        func(spec, meta)
    if meta == (spec.meta or {}):
        return spec
    return replace(spec, meta=meta or None)


# --- run -----------------------------------------------------------------------------------------------


def run_chain(app: HasMiddleware) -> list[tuple[str, RunMiddleware]]:
    """The run middleware of a worker of `app`, outermost first: the process's, then the app's."""
    return process().run + app.middleware.run


class Attempt:
    """The run middleware of one attempt: entered in order before the handler, left in reverse after it.
    jobsup.worker.runner.Runner drives it and decides what each outcome writes."""

    __slots__ = ("chain", "job", "started", "trace")

    def __init__(self, chain: list[tuple[str, RunMiddleware]], job: Job) -> None:
        self.chain = chain
        self.job = job
        self.started: list[tuple[str, Generator[None, RunOutcome, None]]] = []
        self.trace: tuple[str, str] | None = None  # (trace id, span id) in hex, for the supervisor's log

    def enter(self) -> tuple[str, BaseException] | None:
        """Run each middleware up to its yield; the name and exception of one that raised (the rest are
        not started), or None."""
        otel.forget_trace()
        try:
            for name, func in self.chain:
                try:
                    steps = func(self.job)
                    next(steps)
                except StopIteration:
                    return name, RuntimeError(f"run middleware {name} returned without yielding")
                except BaseException as exc:
                    return name, exc
                self.started.append((name, steps))
            return None
        finally:
            # Tracing, outermost, has started its span (if on) before anything here can fail.
            self.trace = otel.attempt_trace()

    def leave_one(self, outcome: RunOutcome) -> tuple[str, BaseException] | None:
        """Resume the innermost middleware not yet left with `outcome`; its name and exception if it
        raised (or yielded again), else None."""
        name, steps = self.started.pop()
        try:
            steps.send(outcome)
        except StopIteration:
            return None
        except BaseException as exc:
            return name, exc
        steps.close()
        return name, RuntimeError(f"run middleware {name} yielded more than once")

    def close(self) -> None:
        """Nothing to release: kept for the worker, which closes every attempt it entered."""
