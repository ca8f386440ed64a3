"""The old path of the worker process's code, for one release: importing it warns (DeprecationWarning).

The worker process, and what the supervisor and jobsup.testing share of it, is jobsup.worker: the entry
in main.py, Runner in runner.py, a job's wire form in messages.py.
"""

import warnings

from jobsup.worker.main import PARENT_CHECK_INTERVAL as PARENT_CHECK_INTERVAL
from jobsup.worker.main import worker_main as worker_main
from jobsup.worker.messages import column_json as column_json
from jobsup.worker.messages import job_fields as job_fields
from jobsup.worker.messages import job_of as job_of
from jobsup.worker.runner import Runner as Runner
from jobsup.worker.runner import run_hooks as run_hooks

warnings.warn(
    f"{__name__} moved to jobsup.worker (main, runner, messages); the old path goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
