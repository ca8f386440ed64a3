"""Jobs that share a worker process: the worker's side.

A handler declared `shared=True` has its jobs run several at once in one worker process: an async
handler's as tasks on the worker's event loop, a sync handler's in the worker's threads. The supervisor
sends SHARED messages (messages.py) with no more jobs than the process has room for (--capacity, and a
handler's per_process), and a CANCEL to stop one of them (a timeout, an operator's cancel); each job is
answered as it ends, as an alone job is.

Pinning a crash on its cause: each job runs inside a function of its own whose name carries the job's
id (`jobsup_job_<id>`), and the process's faulthandler writes the stack of the thread that crashed into
a file the supervisor reads once the process is dead. A segfault, an abort or a bus error thus names
the job that caused it, and its neighbours are run again without losing an attempt. The same names let
the loop's watchdog say which job blocks the event loop (a sync call inside an `async def`).
"""

from __future__ import annotations

import asyncio
import contextvars
import faulthandler
import os
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, NoReturn

from jobsup.job import Job
from jobsup.outcomes import Answer
from jobsup.worker import messages
from jobsup.worker.messages import CANCEL, JOBS, SHARED, STOP, Message, job_of
from jobsup.worker.runner import Runner
from jobsup.worker.wire import Reader

# The name of the function each shared job runs in: what a stack (faulthandler's, the watchdog's
# sample) shows of the job that was running.
JOB_FRAME = "jobsup_job_"
_JOB_FRAME_ID = re.compile(r"\b" + JOB_FRAME + r"(\d+)\b")
# The loop notes the time every TICK; the watchdog thread looks every WATCH seconds, and says the loop
# is blocked once it has not ticked for BLOCK_REPORT (the supervisor recycles the process past its
# --loop-block-limit).
TICK = 0.05
WATCH = 0.1
BLOCK_REPORT = 1.0
LAG_EVERY = 1.0  # seconds between two reports of the loop's lag


def job_ids_in(text: str) -> list[int]:
    """The ids of the jobs whose functions a stack's text names, innermost first as stacks print them.

    >>> job_ids_in('  File "x.py", line 3 in handler\\n  File "sharing.py", line 90 in jobsup_job_42\\n')
    [42]
    """
    return [int(m) for m in _JOB_FRAME_ID.findall(text)]


def culprit_of_fault(text: str) -> int | None:
    """The job faulthandler's report names in the thread that crashed ("Current thread ..." up to the
    next thread or the end), or None (the crash was outside every job, or the report is missing).

    >>> report = '''Fatal Python error: Segmentation fault
    ...
    ... Thread 0x01 (most recent call first):
    ...   File "sharing.py", line 90 in jobsup_job_7
    ...
    ... Current thread 0x02 (most recent call first):
    ...   File "h.py", line 3 in crash
    ...   File "sharing.py", line 99 in jobsup_job_8
    ... '''
    >>> culprit_of_fault(report), culprit_of_fault(""), culprit_of_fault("Current thread 0x1:\\n  in main")
    (8, None, None)
    """
    start = text.find("Current thread")
    if start < 0:
        return None
    section = text[start:]
    end = section.find("\nThread 0x")
    ids = job_ids_in(section if end < 0 else section[:end])
    return ids[0] if ids else None


def _report_exits(report: Any) -> None:
    """Make os._exit say which job called it, in faulthandler's words, before the process ends: a
    handler (or a library) that ends the process costs its own attempt, not its neighbours'."""
    real_exit = os._exit

    def _exit(status: int) -> NoReturn:
        frame: types.FrameType | None = sys._getframe(1)
        while frame is not None and not frame.f_code.co_name.startswith(JOB_FRAME):
            frame = frame.f_back
        if frame is not None:
            try:
                report.write(f"Current thread (os._exit({status})):\n  in {frame.f_code.co_name}\n")
                report.flush()
            except (OSError, ValueError):
                pass
        real_exit(status)

    os._exit = _exit


def _renamed(func: Callable[..., Any], job_id: int) -> Callable[..., Any]:
    """`func` as a function named for the job (its frames say which job they run)."""
    name = f"{JOB_FRAME}{job_id}"
    code = func.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, func.__globals__, name, func.__defaults__, func.__closure__)


async def _run_async(shared: Shared, job: Job) -> tuple[Answer, Any]:
    return await shared.runner.arun(job, shared.stopping)


def _run_sync(shared: Shared, job: Job) -> tuple[Answer, Any]:
    return shared.runner.run_traced(job)


class Shared:
    """The jobs a worker runs at once, and the watchdog of its event loop."""

    def __init__(
        self,
        runner: Runner,
        send: Callable[[Message], None],
        capacity: int,
        fault_path: str,
    ) -> None:
        self.runner = runner
        self._send = send
        # The watchdog thread writes to the pipe too: one message at a time.
        self._lock = threading.Lock()
        self.capacity = capacity
        self.loop: asyncio.AbstractEventLoop = runner.loop()
        self.running: dict[int, asyncio.Future[Any]] = {}
        self.ended: asyncio.Future[Message | None] = self.loop.create_future()  # serve()'s
        self.stopping: dict[int, tuple[str, str]] = {}  # job id -> (status, reason) of a cancel asked for
        self._threads: ThreadPoolExecutor | None = None
        self.ticked = time.monotonic()
        self.blocked_reported = False
        self.active = False  # the loop runs shared jobs now (the watchdog looks only then)
        if fault_path:
            # A fatal signal's report (the stack of each thread) goes to a file the supervisor reads.
            self._fault_file = open(fault_path, "w")  # kept open for the process's life
            faulthandler.enable(file=self._fault_file, all_threads=True)
            _report_exits(self._fault_file)
        self._main = threading.main_thread().ident
        threading.Thread(target=self._watch, name="jobsup-loop-watchdog", daemon=True).start()

    def send(self, message: Message) -> None:
        with self._lock:
            self._send(message)

    # --- running ------------------------------------------------------------------------------

    def start(self, jobs: list[Job]) -> None:
        for job in jobs:
            handler = self.runner.handler_of(job.kind)
            if handler is not None and handler[1]:  # async: a task on the loop, with its own context
                future: asyncio.Future[Any] = self.loop.create_task(_renamed(_run_async, job.id)(self, job))
            else:  # sync (or no handler: the runner answers why): a thread, in a copy of the context
                context = contextvars.copy_context()
                future = self.loop.run_in_executor(self.threads(), context.run, _renamed(_run_sync, job.id), self, job)
            self.running[job.id] = future
            future.add_done_callback(partial(self._ended, job, time.perf_counter()))

    def threads(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=self.capacity, thread_name_prefix="jobsup-job")
        return self._threads

    def _ended(self, job: Job, started: float, future: asyncio.Future[Any]) -> None:
        ran = time.perf_counter() - started
        self.running.pop(job.id, None)
        stopped = self.stopping.pop(job.id, None)
        if future.cancelled():  # cancelled before it began: no handler code ran
            answer, trace = Answer(job.id, stopped[1] if stopped else "cancelled before it started"), None
        elif future.exception() is not None:  # the runner answers every failure; this is its own bug
            exc = future.exception()
            answer, trace = Answer(job.id, f"{type(exc).__name__}: {exc}"), None
        else:
            answer, trace = future.result()
        if stopped is not None and answer.error is not None and answer.verb is None:
            answer = answer._replace(error=stopped[1])  # "timed out after 30s", not "CancelledError"
        self.send(messages.answer(answer, ran, trace))
        if not self.running and not self.ended.done():
            self.ended.set_result(messages.IDLE)  # the last job ended: back to the worker's own loop

    def cancel(self, job_id: int, status: str, reason: str) -> None:
        """Stop one job: an async one's task is cancelled (its `finally` blocks run, the others go on);
        a sync one in a thread cannot be, and runs on until the supervisor recycles the process."""
        future = self.running.get(job_id)
        if future is None:
            return
        self.stopping[job_id] = (status, reason)
        future.cancel()

    async def serve(self, reader: Reader, first: list[Job]) -> Message | None:
        """Run `first` and whatever else the supervisor sends, until no job is left; the message that
        is not for this mode (the next alone jobs, a stop), or None when the supervisor is gone.

        Messages are handled as they are read (no task per message, no wait over every running job):
        the mode ends when the last job ends or a message for the other mode comes."""
        loop = self.loop
        self.ended = ended = loop.create_future()

        def handle(got: Sequence[Message | None]) -> None:
            for number, message in enumerate(got):
                if ended.done():  # for the next mode, in order: the caller reads them first
                    reader.push_back([m for m in got[number:] if m is not None])
                    return
                if message is None or message[0] in (STOP, JOBS):
                    ended.set_result(message)
                elif message[0] == SHARED:
                    self.start([job_of(fields) for fields in messages.read_jobs(message)])
                elif message[0] == CANCEL:
                    self.cancel(*messages.read_cancel(message))

        def readable() -> None:
            try:
                got = reader.read_available()
            except OSError:
                got = None
            if got is None:  # None: the supervisor is gone
                loop.remove_reader(reader.fd)
                handle([None])
            else:
                handle(got)

        self.start(first)
        handle(reader.take_buffered())  # read with the one that began this mode
        loop.add_reader(reader.fd, readable)
        self.active = True
        self.ticked = time.monotonic() - TICK
        ticker = loop.create_task(self._tick())
        try:
            left = await ended
            if left is None or left[0] == STOP:
                for future in list(self.running.values()):  # the supervisor is gone or stops us: stop them
                    future.cancel()
                if self.running:
                    await asyncio.wait(set(self.running.values()), timeout=1.0)
        finally:
            with self._lock:
                self.active = False
            ticker.cancel()
            try:
                loop.remove_reader(reader.fd)
            except (ValueError, OSError):
                pass
        return left

    async def _tick(self) -> None:
        """Note that the loop comes round, and once a second tell the supervisor how late it came
        round at worst (the loop's lag: what a neighbour's CPU work or sync call costs every job)."""
        lag = 0.0
        told = time.monotonic()
        while True:
            now = time.monotonic()
            lag = max(lag, now - self.ticked - TICK)
            self.ticked = now
            if self.blocked_reported:
                self.blocked_reported = False
                self.send(messages.unblocked())
            if now - told >= LAG_EVERY:
                self.send(messages.lag(round(max(lag, 0.0), 4)))
                lag, told = 0.0, now
            await asyncio.sleep(TICK)

    def _watch(self) -> None:
        """A thread: say when the event loop has not come round for BLOCK_REPORT seconds while it has
        jobs, naming them and, from a sample of the main thread's stack, the one that blocks it."""
        while True:
            time.sleep(WATCH)
            if not self.active or self.blocked_reported or not self.running:
                continue
            behind = time.monotonic() - self.ticked
            if behind < BLOCK_REPORT:
                continue
            frame = sys._current_frames().get(self._main) if self._main is not None else None
            culprit = None
            while frame is not None:
                if frame.f_code.co_name.startswith(JOB_FRAME):
                    culprit = int(frame.f_code.co_name[len(JOB_FRAME) :])
                    break
                frame = frame.f_back
            with self._lock:
                if not self.active:
                    continue
                self.blocked_reported = True
                try:
                    self._send(messages.blocked(messages.Blocked(round(behind, 3), sorted(self.running), culprit)))
                except OSError:
                    return
