"""The worker process: it imports the app, then runs one job at a time as the supervisor sends them.

It never talks to the database. It reads JOBS messages from its pipe (messages.py: each job's payload
as the JSON text the claim returned, parsed here, not in the supervisor's one thread), runs them in order
and answers each with an ANSWER: its id, the error and traceback of a failure (None, None when
done), a done job's return value as JSON text, the verb of a handler's Snooze, RetryAfter or Discard,
and the seconds the handler ran, measured here (the supervisor decides from it whether jobs are short
enough to hand out several at a time, and records it as the job's run time; a time taken from its side
would count the trip through the pipes, which a loaded machine stretches to milliseconds). Whatever
kills it instead, the supervisor sees it go at once and records the failed attempt of the job it was
running itself.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections import deque
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from jobsup.worker import messages
from jobsup.worker.messages import JOBS, SHARED, STOP, JobFields, job_of
from jobsup.worker.runner import Runner, describe, run_hooks
from jobsup.worker.wire import Reader, send

if TYPE_CHECKING:
    from jobsup.app import App

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


def _serve(
    inbox: Connection, outbox: Connection, app_target: str, django_settings: str, capacity: int, fault_path: str
) -> None:
    from jobsup.errors import JobsupError

    fd = outbox.fileno()
    reader = Reader(inbox.fileno())

    try:
        app = _load(app_target, django_settings)
    except JobsupError as exc:
        send(fd, messages.fatal(str(exc)))
        sys.exit(3)
    except BaseException as exc:  # an app whose import raises SystemExit or worse
        send(fd, messages.fatal(f"importing {app_target or django_settings} failed: {describe(exc)}"))
        sys.exit(3)

    runner = Runner(app)
    try:
        run_hooks(runner, app.worker_start)
    except BaseException as exc:
        why = f"a worker start function of {app_target or django_settings} failed: {describe(exc)}"
        send(fd, messages.fatal(why))
        sys.exit(3)
    handlers = runner.handlers
    timeouts = {kind: h.timeout for kind, h in app.handlers.items() if h.timeout is not None}
    # An app that finds handlers by name (Django's tasks, by module path) handles any kind: None says so,
    # and the supervisor sends every kind here instead of failing unknown ones itself.
    limits = {kind: h.limits.to_json() for kind, h in app.handlers.items() if h.limits.limited}
    # The kinds whose jobs share a process, each with its cap in one process (0: the process's capacity).
    shared = {kind: h.per_process or 0 for kind, h in app.handlers.items() if h.shared}
    kinds = None if app.finds_kinds else sorted(handlers)
    send(fd, messages.ready(messages.Ready(os.getpid(), kinds, timeouts, list(app.schedules.values()), limits, shared)))

    if runner.middleware:
        # Stopped while it runs an attempt, the worker leaves the attempt's run middleware first (a span
        # ends saying it timed out) instead of vanishing in the middle of them; then it ends by the
        # signal as before. Without middleware it dies at once, as it always has.
        signal.signal(signal.SIGTERM, lambda signum, frame: _stopped(runner, reader))

    batch = _Batch(fd)
    signal.signal(signal.SIGUSR1, batch.on_signal)
    sharing = None
    answer_message = messages.answer
    message: messages.Message | None = None
    while True:
        if message is None:
            try:
                message = reader.read_one()
            except OSError:
                message = None
        if message is None or message[0] == STOP:  # None: the supervisor is gone
            if message is not None:  # a clean stop: what the start functions opened is closed
                run_hooks(runner, app.worker_stop, quiet=True)
            return
        tag = message[0]
        if tag == SHARED:
            if sharing is None:
                from jobsup.worker.sharing import Shared

                sharing = Shared(runner, partial(send, fd), capacity, fault_path)
            first = [job_of(fields) for fields in messages.read_jobs(message)]
            message = runner.loop().run_until_complete(sharing.serve(reader, first))
            if message is messages.IDLE:
                message = None
            continue
        if tag == JOBS:
            # Jobs run in the order given, each answered as it ends, so the supervisor always knows which
            # one runs: the first it has no answer for. Those behind a job that turns out slow are given
            # back when the supervisor asks (SIGUSR1, _Batch.recall).
            pending = batch.pending
            pending.extend(messages.read_jobs(message))
            batch.asked = False  # a request that came while it was idle was for jobs it has finished
            while pending:
                job = job_of(pending.popleft())
                started = time.perf_counter()
                batch.running = True
                answer = runner.run(job)
                batch.running = False
                ran = time.perf_counter() - started
                # with the attempt's trace and span, if traced, for the supervisor's log lines about it
                send(fd, answer_message(answer, ran, runner.trace))
                if batch.asked:
                    batch.recall()
        # INTERRUPT: the reason of a SIGTERM for a job it finished meanwhile; CANCEL: of a shared job that
        # ended meanwhile
        message = None


class _Batch:
    """The alone jobs a worker was handed together, and giving back those it has not started.

    The supervisor hands short jobs several at a time; when one of them turns out slow, it sends
    SIGUSR1 and the jobs not started yet go back to it (a RECALLED message) for a free worker to run.
    The handler does it at once while a job runs (the main loop is then inside the job, not touching
    the batch or the pipe), else it asks the loop to, before the next job starts: either way a job is
    given back or started, never both."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # The jobs not started yet: the loop takes each with popleft, the recall takes the rest (one C
        # call each: a signal between two bytecodes sees one or the other, never a job in both).
        self.pending: deque[JobFields] = deque()
        self.running = False  # a job of the batch runs now
        self.asked = False

    def on_signal(self, signum: int, frame: object) -> None:
        if self.running:
            self.recall()
        else:
            self.asked = True

    def recall(self) -> None:
        self.asked = False
        back = [fields[0] for fields in self.pending]
        self.pending.clear()
        send(self.fd, messages.recalled(back))


def _stopped(runner: Runner, reader: Reader) -> None:
    """SIGTERM: finish the running attempt's middleware with the reason the keeper sent just before the
    signal (an INTERRUPT; none for a SIGTERM from elsewhere), then end by the signal."""
    status, reason = "failed", "the worker received SIGTERM"
    try:
        for message in reader.read_ready():
            if message[0] == messages.INTERRUPT:
                status, reason = messages.read_interrupt(message)
        runner.stop(status, reason)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def exit_cause(exitcode: int | None) -> str:
    """Why a worker process ended, in the words last_error uses: what the supervisor's keeper and
    jobsup.testing.drain record of a worker that ended by itself (a handler's crash, the OOM killer).

    >>> exit_cause(-11), exit_cause(-9), exit_cause(3)
    ('worker exited with signal SIGSEGV', 'worker killed (SIGKILL; out of memory?)', 'worker exited with code 3')
    """
    if exitcode is None:
        return "worker vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if name == "SIGKILL":
            return "worker killed (SIGKILL; out of memory?)"
        return f"worker exited with signal {name}"
    return f"worker exited with code {exitcode}"
