"""jobsup: a PostgreSQL job queue for Python, run by a process supervisor, watched from a console."""

from .app import App, Handler, load_app
from .errors import JobsupError
from .job import Job, JobSpec
from .pool import AsyncQueue, Queue
from .queue import aenqueue, aenqueue_many, enqueue, enqueue_many

__version__ = "0.1.0"

__all__ = [
    "App", "AsyncQueue", "Handler", "Job", "JobSpec", "JobsupError", "Queue", "__version__",
    "aenqueue", "aenqueue_many", "enqueue", "enqueue_many", "load_app",
]
