"""Helpers for testing your handlers without a supervisor: `drain` runs the due jobs of an app in the
test's own process (or in real worker processes) against the test's database, through the statements
the supervisor uses, so retries, snoozes, burial and cancels come out as in production; `enqueued` and
`assert_enqueued` look at what a piece of code enqueued.

    from jobsup.testing import assert_enqueued, drain

    def test_signup_sends_a_welcome(conn):
        signup(conn, "a@example.com")
        assert_enqueued(conn, "email", to="a@example.com")
        assert drain(app, conn).outcomes() == {1: "done"}
"""

from __future__ import annotations

import ast
import json
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.app import App, load_app
from jobsup.db import lifecycle
from jobsup.db.json_text import loads
from jobsup.db.lifecycle import BACKOFF_BASE, BACKOFF_CAP, Cancel, Outcome, Snoozed
from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import AppNotFound, BadInput, JobsupError
from jobsup.job import Claimed, Job
from jobsup.ops.limits import declare, in_force
from jobsup.outcomes import Answer

# What a drained job's lease is: the drain writes each outcome right after its run, so only a handler
# that runs longer than this could lose its job to a supervisor's reaper sharing the database.
LEASE = 3600.0
# A drain that has run this many jobs and still finds more due stops with an error rather than loop for
# ever (a handler that always fails with with_scheduled=True dies after max_attempts, so this is a bug).
MAX_RUNS = 10_000
# With processes=True: a job's time limit when its handler sets none (jobsup start's --timeout), how
# long a stopped worker gets between SIGTERM and SIGKILL, and how long a worker may take to start.
TIMEOUT = 300.0
KILL_GRACE = 2.0
START_TIMEOUT = 60.0


@dataclass(frozen=True)
class Ran:
    """One run of a handler and what it made of its job: `done`, `failed` (queued for a retry), `dead`,
    `snoozed` or `cancelled` (a Discard, or a cancel requested meanwhile)."""

    id: int
    kind: str
    attempt: int
    outcome: str
    error: str | None = None
    return_value: Any = None


class Drained(list[Ran]):
    """Every run of a drain, in order."""

    def outcomes(self) -> dict[int, str]:
        """Each job's last outcome, by id."""
        return {ran.id: ran.outcome for ran in self}

    def counts(self) -> Counter[str]:
        """Runs by outcome."""
        return Counter(ran.outcome for ran in self)


def drain(
    app: App | str,
    conn: psycopg.Connection,
    *,
    queues: list[str] | None = None,
    with_scheduled: bool = False,
    processes: bool = False,
    timeout: float = TIMEOUT,
    max_runs: int = MAX_RUNS,
    backoff_base: float = BACKOFF_BASE,
    backoff_cap: float = BACKOFF_CAP,
    jitter: float = 0.0,
) -> Drained:
    """Run due jobs of `queues` (default: every queue with queued jobs) until none is due; every run.

    `app` is an App or its "module:attribute". Each job is claimed, run and its outcome written with the
    supervisor's own statements (claim, complete, fail, snooze, cancel_held), so attempts, backoff,
    burial and cancels follow the same rules; a job of a kind the app has no handler for stays queued, as it
    does under a supervisor of this app.
    A retry or snooze waits for its time as in production: with `with_scheduled=True` every job waiting
    (a retry, a snooze, a delayed job) is made due at once and run too, so a drain goes on until nothing
    is queued at all. `processes=True` runs each job in a real worker process of jobsup's (spawned from
    a fork server, with the app imported by name), so a crash of the handler's own or its `timeout`
    (seconds, unless its handler sets one) fails that attempt as under the supervisor. `conn` may be in a
    transaction of the test's; the drain's statements then run in it."""
    if processes:
        _refuse_unguarded_main()
    if isinstance(app, str):
        target, app = app, load_app(app)
    else:
        target = _target_of(app) if processes else ""
    locked_by = f"jobsup.testing:{os.getpid()}"
    kinds = None if app.finds_kinds else list(app.handlers)
    # As a supervisor does before its first claim: the limits the app declares are those in force
    # (unless an operator's win), so a test's drain obeys them without a supervisor ever having run.
    declare(conn, {kind: h.limits for kind, h in app.handlers.items()}, app.handlers, locked_by)
    runs = Drained()
    runner: _Inline | _Processes = _Processes(target, timeout) if processes else _Inline(app)
    try:
        while True:
            names = queues if queues is not None else [r[0] for r in conn.execute(SQL["testing_queues"])]
            if with_scheduled and names:
                conn.execute(SQL["testing_due_now"], {"queues": list(names)})
            # As the supervisor's claims: its JSON as text, which a worker process parses (and _Inline here).
            jobs = lifecycle.claim_text(conn, names, 1, locked_by, LEASE, kinds=kinds) if names else []
            if not jobs and names:
                jobs, wake = _claim_limited(conn, names, locked_by, kinds)
                if not jobs and wake is not None:  # a rate holds the next start back: wait for it
                    time.sleep(max(0.0, (wake - datetime.now(UTC)).total_seconds()))
                    continue
            if not jobs:
                return runs
            if len(runs) >= max_runs:
                raise JobsupError(
                    f"drain ran {max_runs} jobs and more are due (a job that snoozes or fails "
                    f"for ever?); pass max_runs= to allow more"
                )
            job = jobs[0]
            answer = runner.run(job)
            runs.append(_write(conn, job, answer, locked_by, backoff_base, backoff_cap, jitter))
    finally:
        runner.close()


def _claim_limited(
    conn: psycopg.Connection, queues: Sequence[str], locked_by: str, kinds: Sequence[str] | None
) -> tuple[list[Claimed], datetime | None]:
    """One job of a limited kind, as its limits allow (the supervisor's claim_limited): the drain runs
    one job at a time, so a concurrency limit also counts what supervisors running meanwhile hold."""
    limited = [k for k in in_force(conn) if kinds is None or k in kinds]
    if not limited:
        return [], None
    return lifecycle.claim_limited_text(conn, limited, queues, 1, locked_by, LEASE)


def _write(
    conn: psycopg.Connection,
    job: Claimed,
    answer: Answer,
    locked_by: str,
    backoff_base: float,
    backoff_cap: float,
    jitter: float,
) -> Ran:
    """Write `answer` with the statement the supervisor's dispatcher would (lifecycle.record_of), one job
    at a time."""
    record = lifecycle.record_of(job, answer)
    if record is None:
        value = answer.value
        lifecycle.complete(conn, [(job.id, job.attempts)], locked_by, [value] if value is not None else None)
        return Ran(job.id, job.kind, job.attempts, "done", None, json.loads(value) if value is not None else None)
    if isinstance(record, Snoozed):
        snoozed: Sequence[Outcome | None] = lifecycle.snooze(conn, [record], locked_by) or [None]
        [outcome] = snoozed  # None: the job was no longer held
        return Ran(
            job.id,
            job.kind,
            job.attempts,
            "snoozed" if outcome and outcome.status == "queued" else "cancelled",
            answer.error,
        )
    if isinstance(record, Cancel):
        lifecycle.cancel_held(conn, [record], locked_by)
        return Ran(job.id, job.kind, job.attempts, "cancelled", answer.error)
    failed: Sequence[Outcome | None] = lifecycle.fail(
        conn, [record], locked_by, backoff_base=backoff_base, backoff_cap=backoff_cap, jitter=jitter
    ) or [None]
    [outcome] = failed
    status = outcome.status if outcome is not None else "failed"
    return Ran(job.id, job.kind, job.attempts, {"queued": "failed"}.get(status, status), answer.error)


def _refuse_unguarded_main() -> None:
    """BadInput when drain(processes=True) is called by the top-level code of the script being run,
    outside `if __name__ == "__main__":`.

    Each worker process is started as multiprocessing starts one: it imports the script again (as
    __mp_main__) before it runs, so that code would truncate, enqueue and so on a second time, then call
    drain again, which multiprocessing refuses with a RuntimeError, and the worker would never start.
    Checked here, in the script's own process, before any worker is started, so nothing runs twice."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # This process is a worker importing the script, which the check in its parent missed (code it
        # could not read): say why rather than let multiprocessing's RuntimeError say it.
        raise BadInput(_unguarded(spec_name or str(getattr(main, "__file__", None) or "__main__")))
    if main is None or (spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__"))):
        return  # no script, or a package's __main__, which multiprocessing does not import again
    path = getattr(main, "__file__", None)
    if path is None:  # python -c, an interactive session, a notebook: nothing is imported again
        return
    calling = None  # the frame of the script's top-level code that led here, if any
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            calling = frame
        frame = frame.f_back
    if calling is None:  # called from elsewhere (pytest, a function the script runs under its guard)
        return
    try:
        with open(path, "rb") as source:
            tree = ast.parse(source.read(), path)
    except (OSError, SyntaxError, ValueError):
        return  # a script that cannot be read here: the worker's own check says it, if need be
    if not any(calling.f_lineno in lines for lines in _guarded_lines(tree)):
        raise BadInput(_unguarded(spec_name or path))


def _unguarded(script: str) -> str:
    return (
        f"drain(processes=True) was called by code that runs when the script {script} is imported, and each "
        "worker process imports it again (as multiprocessing does): put the code that calls it under "
        '`if __name__ == "__main__":`'
    )


def _guarded_lines(tree: ast.Module) -> list[range]:
    """The line ranges that run only when the script is run, not imported: the body of each
    `if __name__ == "__main__":` (the else of `if __name__ != "__main__":`).

    >>> _guarded_lines(ast.parse("x = 1\\nif __name__ == '__main__':\\n    x = 2\\n    x = 3\\n"))
    [range(3, 5)]
    """
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1):
            continue
        sides = [node.test.left, *node.test.comparators]
        names = {n.id for n in sides if isinstance(n, ast.Name)}
        constants = {n.value for n in sides if isinstance(n, ast.Constant)}
        if names != {"__name__"} or constants != {"__main__"}:
            continue
        op = node.test.ops[0]
        body = node.body if isinstance(op, ast.Eq) else node.orelse if isinstance(op, ast.NotEq) else []
        if body:
            found.append(range(body[0].lineno, (body[-1].end_lineno or body[-1].lineno) + 1))
    return found


def _target_of(app: App) -> str:
    """The "module:attribute" a worker process imports `app` by."""
    for name, module in list(sys.modules.items()):
        if name == "__main__" or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is app and attr.isidentifier():
                return f"{name}:{attr}"
    raise BadInput(
        "drain(processes=True) needs an app that a worker can import: a module-level App, or its 'module:attribute'"
    )


class _Inline:
    """The test's own process as the one worker: the app's worker start functions run first, its stop
    functions at the end, as in a worker of jobsup start."""

    def __init__(self, app: App) -> None:
        from jobsup.worker.runner import Runner, run_hooks

        self.runner = Runner(app)
        run_hooks(self.runner, app.worker_start)

    def run(self, claimed: Claimed) -> Answer:
        return self.runner.run(_handlers_job(claimed))

    def close(self) -> None:
        from jobsup.worker.runner import run_hooks

        run_hooks(self.runner, self.runner.app.worker_stop, quiet=True)


def _handlers_job(claimed: Claimed) -> Job:
    """The Job a handler sees of a claimed job: its JSON read, every column of it kept (a worker process
    is sent fewer: jobsup.worker.messages.job_of), and an empty list for no errors."""
    payload, errors, meta = claimed.payload, claimed.errors, claimed.meta
    return Job._make(
        (
            *claimed[:2],
            loads(payload),
            *claimed[3:10],
            loads(errors) if errors else [],
            claimed.started_at,
            claimed.key,
            None if meta is None else loads(meta),
        )
    )


class _Processes:
    """One worker process of jobsup's at a time, replaced when it dies or is stopped for a timeout,
    as the supervisor's keeper does (jobsup/supervisor/keeper.py), through the same jobsup.worker."""

    def __init__(self, target: str, timeout: float) -> None:
        self.target = target
        self.timeout = timeout
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["jobsup.worker.main"])
        self.timeouts: dict[str, float] = {}
        self.process: BaseProcess | None = None  # None once closed
        self._start()

    def _start(self) -> None:
        from jobsup.worker import messages
        from jobsup.worker.main import worker_main
        from jobsup.worker.wire import Reader

        their_inbox, self.inbox = self.ctx.Pipe(duplex=False)
        self.outbox, their_outbox = self.ctx.Pipe(duplex=False)
        self.process = self.ctx.Process(
            target=worker_main,
            name="jobsup-testing-worker",
            args=(their_inbox, their_outbox, self.target, os.getpid(), os.getcwd(), ""),
        )
        self.process.start()
        their_inbox.close()
        their_outbox.close()
        self.reader = Reader(self.outbox.fileno())
        self.pending: list[tuple] = []
        message = self._next(START_TIMEOUT)
        if not isinstance(message, tuple) or message[0] != messages.READY:
            reason = "the worker did not start"
            if isinstance(message, tuple) and message[0] == messages.FATAL:
                reason = messages.read_fatal(message)
            self.close()
            raise AppNotFound(reason)
        self.timeouts = dict(messages.read_ready(message).timeouts)

    def _next(self, timeout: float) -> tuple | str:
        """The worker's next message; "ended" if the worker is gone, "timeout" after `timeout` seconds
        (it still runs then)."""
        process = self.process
        assert process is not None, "the worker process is closed"
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not wait([self.outbox, process.sentinel], left):
                return "timeout"
            if self.outbox.poll():
                messages = self.reader.read_available()
                if messages is None:  # its end of the pipe closed: it is exiting
                    process.join(START_TIMEOUT)
                    return "ended"
                self.pending.extend(messages)
            elif not process.is_alive():
                return "ended"
        return self.pending.pop(0)

    def run(self, job: Claimed) -> Answer:
        from jobsup.worker import messages
        from jobsup.worker.main import exit_cause
        from jobsup.worker.wire import send

        send(self.inbox.fileno(), messages.jobs([job]))
        limit = self.timeouts.get(job.kind, self.timeout)
        message = self._next(limit)
        if isinstance(message, tuple):
            answer, _ = messages.read_answer(message)  # the trace of a traced run: not the drain's to log
            return answer
        process = self.process
        assert process is not None, "the worker process is closed"
        if message == "timeout":
            cause = f"timed out after {limit:g}s"
            # As the keeper does: the reason first, for the run middleware of the attempt it stops.
            try:
                send(self.inbox.fileno(), messages.interrupt(messages.Interrupt("timed_out", cause)))
            except OSError:
                pass
            process.terminate()
            process.join(KILL_GRACE)
            if process.is_alive():
                assert process.pid is not None  # it was started
                os.kill(process.pid, signal.SIGKILL)
        else:
            cause = None
        process.join(5)
        cause = cause or exit_cause(process.exitcode)
        self._close_pipes()
        self._start()
        return Answer(job.id, cause)

    def _close_pipes(self) -> None:
        for end in (self.inbox, self.outbox):
            try:
                end.close()
            except OSError:
                pass

    def close(self) -> None:
        from jobsup.worker import messages
        from jobsup.worker.wire import send

        if self.process is None:
            return
        try:
            send(self.inbox.fileno(), messages.stop())
        except (OSError, ValueError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self._close_pipes()
        self.process = None


def enqueued(conn: psycopg.Connection, kind: str | None = None, **payload_subset: Any) -> list[dict[str, Any]]:
    """Jobs (any status) of `kind` (None: any) whose payload holds every key=value given, oldest first:
    dicts of id, kind, queue, payload, status, priority, attempts, max_attempts, run_at, snoozes."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SQL["testing_enqueued"], {"kind": kind, "subset": json.dumps(payload_subset)})
        return cur.fetchall()


def assert_enqueued(
    conn: psycopg.Connection, kind: str | None = None, *, count: int | None = None, **payload_subset: Any
) -> list[dict[str, Any]]:
    """The jobs `enqueued` finds; an AssertionError listing what was enqueued when there are none (or
    not `count` of them)."""
    found = enqueued(conn, kind, **payload_subset)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    wanted = " ".join([f"kind={kind!r}" if kind else "any kind"] + [f"{k}={v!r}" for k, v in payload_subset.items()])
    everything = enqueued(conn)
    lines = [
        f"  {j['id']} {j['kind']} queue={j['queue']} {j['status']} payload={json.dumps(j['payload'])}"
        for j in everything[-20:]
    ]
    more = f"  (and {len(everything) - 20} earlier)\n" if len(everything) > 20 else ""
    expected = "a job" if count is None else f"{count} job{'s' if count != 1 else ''}"
    raise AssertionError(
        f"expected {expected} of {wanted}, found {len(found)}; enqueued were "
        f"{len(everything)}:\n" + more + ("\n".join(lines) if lines else "  (none)")
    )


def migrate(database: psycopg.Connection | str | None = None) -> list[str]:
    """Create or upgrade the jobsup schema, as `jobsup migrate` does, for a test database: in `database`,
    a connection (inside its transaction, if one is open) or a DSN; None is the database the command
    line would use (JOBSUP_DSN, DATABASE_URL, else the embedded server). The names of the migrations it
    applied, such as "0001_initial" (none once the schema is current); safe to run twice and from two
    processes at once."""
    from jobsup.db import dsn as dsns
    from jobsup.db.migrate import migrate as apply

    if isinstance(database, psycopg.Connection):
        return [f"{m.version:04d}_{m.name}" for m in apply(database)]
    with dsns.connect(dsns.resolve(database)) as conn:
        return [f"{m.version:04d}_{m.name}" for m in apply(conn)]
