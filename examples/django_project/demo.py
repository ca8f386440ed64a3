"""`make demo-django`: the example Django project run by jobsup on the embedded PostgreSQL.

1. the embedded PostgreSQL of the default data directory (JOBSUP_DATA_DIR moves it), unless JOBSUP_DSN
   (or DATABASE_URL) names a server; then `jobsup migrate`;
2. `jobsup start --django mysite.settings --queues default,emails` in the background, its log in a
   directory of this run's own under the temporary directory (TMPDIR), printed;
3. `python manage.py enqueue_demo`: tasks enqueued inside atomic(), their results printed;
4. the supervisor stopped (SIGTERM), and the embedded PostgreSQL too if this demo started it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from examples.demo import leave_database, log_dir, stop_supervisor
from jobsup import JobsupError
from jobsup.db import dsn as dsns
from jobsup.db import embedded


def main() -> int:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONWARNINGS": "ignore::UserWarning:platformdirs.api",
    }
    named = os.environ.get("JOBSUP_DSN") or os.environ.get("DATABASE_URL")
    data_dir = embedded.data_dir_from(None)
    started_db = not named and embedded.running_dsn(data_dir) is None
    try:
        dsns.resolve(None, None)  # starts the embedded server when nothing names one
    except JobsupError as exc:
        print(f"demo-django: {exc}", file=sys.stderr)
        return 1
    log_path = log_dir("demo-django") / "supervisor.log"
    supervisor = None
    try:
        if subprocess.run([sys.executable, "-m", "jobsup", "migrate"], env=env, cwd=HERE).returncode:
            return 1
        with open(log_path, "w") as log:
            supervisor = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "jobsup",
                    "start",
                    "--django",
                    "mysite.settings",
                    "--procs",
                    "2",
                    "--queues",
                    "default,emails",
                    "--backoff-base",
                    "200ms",
                ],
                env=env,
                cwd=HERE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        print(f"supervisor pid {supervisor.pid}, log {log_path}")
        return subprocess.run([sys.executable, "manage.py", "enqueue_demo"], env=env, cwd=HERE).returncode
    except KeyboardInterrupt:
        return 130
    finally:
        if supervisor is not None:
            stop_supervisor(supervisor, log_path)
        leave_database(started_db, named, data_dir)


if __name__ == "__main__":
    sys.exit(main())
