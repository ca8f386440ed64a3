"""`make demo`: a live queue to watch. Starts the database and a supervisor, feeds it, opens `jobsup top`.

    python examples/demo.py            # the embedded PostgreSQL, no setup; or JOBSUP_DSN=... for another

1. the embedded PostgreSQL of the default data directory (JOBSUP_DATA_DIR moves it), unless JOBSUP_DSN
   (or DATABASE_URL) names a server; then `jobsup migrate`;
2. `jobsup start --procs 8 --app examples.demo_app:app` in the background, its log (and the feed's) in
   a directory of this run's own under the temporary directory (TMPDIR), printed at the start and end;
3. a steady mix of jobs (examples/demo_app.py says what each fate does): most succeed, some fail and
   retry, some die, some crash their worker, some are slow, a few hang until their timeout; webhooks
   and exports held back by their limits; and every few seconds a workflow (resizes, then an album);
4. `jobsup web` in the background on 127.0.0.1 (port JOBSUP_WEB_PORT, 8080 by default), its address
   with its token printed before the console opens;
5. `jobsup top` in the foreground. Press r on a dead job to requeue it, q to quit.

Quitting the console stops the feed and the web console, sends the supervisor SIGTERM and waits for it
(its workers go with it), and stops the embedded PostgreSQL if the demo started it: nothing is left running.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg

from examples.demo_app import app
from jobsup import JobsupError
from jobsup.db import dsn as dsns
from jobsup.db import embedded

PROCS = 8
JOBS_PER_SECOND = 15  # the feed; eight workers keep up with it, so the backlog stays small
SHUTDOWN_TIMEOUT = "5s"  # how long the supervisor lets running jobs finish when the demo ends
STOP_WAIT = 30.0  # seconds to wait for the supervisor to exit before it is killed

# (weight, kind, payload, delay): the mix of the feed; about 1 job in 50 ends dead.
MIX = [
    (60, "email", {"fate": "ok"}, 0),
    (8, "email", {"fate": "flaky", "fails": 1}, 0),
    (3, "email", {"fate": "flaky", "fails": 2}, 0),
    (1, "email", {"fate": "doomed"}, 0),
    (10, "webhook", {"fate": "ok", "url": "https://hooks.example/orders"}, 0),
    (0.5, "webhook", {"fate": "doomed", "url": "https://hooks.example/orders"}, 0),
    (2, "webhook", {"fate": "ok", "url": "https://hooks.example/refunds"}, 0),
    (6, "resize", {"fate": "ok"}, 0),
    (0.7, "resize", {"fate": "crash"}, 0),
    (0.3, "resize", {"fate": "crash", "always": True}, 0),
    (2, "report", {"fate": "slow"}, 0),
    (0.3, "export", {"fate": "hang"}, 0),
    (1, "export", {"fate": "ok"}, 0),
    (3, "email", {"fate": "ok", "digest": True}, 30),  # scheduled: shown as such until due
]


def log_dir(name: str) -> Path:
    """A new directory for this run's logs, such as /tmp/jobsup-demo-k3j9x2: two demos at once (another
    data directory, another user) never write into each other's logs, and one run's logs outlive the
    next run. mkdtemp makes it readable by this user only."""
    return Path(tempfile.mkdtemp(prefix=f"jobsup-{name}-"))


def jobsup(*args: str) -> list[str]:
    return [sys.executable, "-m", "jobsup", *args]


CUSTOMERS = ["acme", "globex", "initech"]  # a webhook's key: one delivery at a time to each
ALBUM_EVERY = 40  # rounds of the feed (8 s) between two workflows


def feed(dsn: str, stop: threading.Event, log) -> None:
    """Enqueue JOBS_PER_SECOND jobs a second, in five batches, and a workflow every ALBUM_EVERY
    batches, until told to stop."""
    rng = random.Random()
    weights = [m[0] for m in MIX]
    conn = None
    rounds = 0
    while not stop.wait(0.2):
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, autocommit=True, connect_timeout=5)
            batch = []
            for _weight, kind, payload, delay in rng.choices(MIX, weights, k=JOBS_PER_SECOND // 5):
                if kind == "webhook":
                    payload = {**payload, "customer": rng.choice(CUSTOMERS)}
                batch.append({"kind": kind, "payload": payload, "delay": delay})
            app.enqueue_many(conn, [app.spec(job) for job in batch])
            if rounds % ALBUM_EVERY == 0:
                album = app.workflow(f"album {rounds // ALBUM_EVERY + 1}")
                photos = [album.add("resize", {"fate": "ok", "photo": n}) for n in range(4)]
                album.add("album", after=photos)
                album.enqueue(conn)
            rounds += 1
        except psycopg.Error as exc:  # the database went away: try again on the next round
            print(f"feed: {exc}".strip(), file=log, flush=True)
            conn = None
    if conn is not None:
        conn.close()


# platformdirs warns when XDG_RUNTIME_DIR is unset (ssh, containers, tmux); its fallback works.
QUIET = "ignore::UserWarning:platformdirs.api"


def say(message: str, error: bool = False) -> None:
    """Print, unless the terminal is gone (after SIGHUP): the clean-up must not stop at a print."""
    try:
        print(message, file=sys.stderr if error else sys.stdout, flush=True)
    except OSError:
        pass


def _leave(signum: int, frame: object) -> None:
    # The terminal went away (SIGHUP) or someone asked the demo to stop: leave through main's finally,
    # which stops what the demo started. Raising here is safe: the main thread only waits for a child.
    raise SystemExit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGHUP, _leave)
    signal.signal(signal.SIGTERM, _leave)
    warnings.filterwarnings("ignore", category=UserWarning, module="platformdirs")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "PYTHONWARNINGS": ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), QUIET])),
    }
    named = os.environ.get("JOBSUP_DSN") or os.environ.get("DATABASE_URL")
    data_dir = embedded.data_dir_from(None)
    started_db = not named and embedded.running_dsn(data_dir) is None
    try:
        dsn = dsns.resolve(None, None)  # starts the embedded server when nothing names one
    except JobsupError as exc:
        say(f"demo: {exc}", error=True)
        return 1
    where = dsns.redact(dsn)
    logs = log_dir("demo")
    log_path = logs / "supervisor.log"
    say(f"logs of this run: {logs}")
    supervisor = None
    web = None
    stop = threading.Event()
    feeder = None
    try:
        if subprocess.run(jobsup("migrate"), env=env, cwd=ROOT).returncode:
            say("demo: `jobsup migrate` failed (see above)", error=True)
            return 1
        with open(log_path, "w") as log:
            # Its own session: a Ctrl-C at the terminal is the console's to handle, not the supervisor's.
            supervisor = subprocess.Popen(
                jobsup(
                    "start",
                    "--procs",
                    str(PROCS),
                    "--app",
                    "examples.demo_app:app",
                    "--queues",
                    "default,reports",
                    "--shutdown-timeout",
                    SHUTDOWN_TIMEOUT,
                ),
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        feed_log = open(logs / "feed.log", "w")
        feeder = threading.Thread(target=feed, args=(dsn, stop, feed_log), name="feed", daemon=True)
        feeder.start()
        web = start_web(env, logs)
        say(f"database {where}; supervisor pid {supervisor.pid}, log {log_path}; opening jobsup top…")
        top = subprocess.run(jobsup("top"), env=env, cwd=ROOT)
        return top.returncode
    except KeyboardInterrupt:
        return 130
    finally:
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)  # the clean-up below runs to its end
        stop.set()
        if feeder is not None:
            feeder.join(timeout=10)
        if web is not None:
            web.terminate()
            web.wait(timeout=STOP_WAIT)
        if supervisor is not None:
            stop_supervisor(supervisor, log_path)
        leave_database(started_db, named, data_dir)


def start_web(env: dict[str, str], logs: Path) -> subprocess.Popen | None:
    """`jobsup web` on loopback, with a token of this run's; None (said why) without the web extra."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        say("the web console needs the web extra (pip install 'jobsup[web]'): not started")
        return None
    port = os.environ.get("JOBSUP_WEB_PORT", "8080")
    token = secrets.token_urlsafe(16)
    with open(logs / "web.log", "w") as log:
        web = subprocess.Popen(
            jobsup("web", "--port", port, "--token", token),
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    say(f"the web console: http://127.0.0.1:{port}/?token={token} (log {logs / 'web.log'})")
    return web


def stop_supervisor(supervisor: subprocess.Popen, log_path: Path) -> None:
    """SIGTERM, then wait for it (its workers go with it), killing it after STOP_WAIT seconds."""
    say(f"stopping the supervisor (pid {supervisor.pid})…")
    if supervisor.poll() is None:
        supervisor.send_signal(signal.SIGTERM)
    try:
        supervisor.wait(timeout=STOP_WAIT)
    except subprocess.TimeoutExpired:
        say(f"the supervisor did not stop within {STOP_WAIT:g}s: killing it", error=True)
        os.killpg(supervisor.pid, signal.SIGKILL)
        supervisor.wait()
    say(f"supervisor exited with code {supervisor.returncode}; its log: {log_path}")
    if log_path.with_name("feed.log").exists():
        say(f"the feed's log: {log_path.with_name('feed.log')}")


def leave_database(started_db: bool, named: str | None, data_dir: Path) -> None:
    """Stop the embedded PostgreSQL if the demo started it; otherwise say it is left running."""
    if started_db:
        embedded.stop(data_dir)
        say(f"stopped the embedded PostgreSQL in {data_dir}")
    elif not named:
        say(
            f"the embedded PostgreSQL in {data_dir} was running before the demo, so it is left running "
            "(`jobsup db stop` stops it)"
        )


if __name__ == "__main__":
    sys.exit(main())
