"""jobsup: a PostgreSQL job queue for Python, run by a process supervisor, watched from a console.

The names below are imported on first use (PEP 562), so `import jobsup` is cheap: the `jobsup` command,
the fork server and every worker import this package first, and a Ctrl-C in the first moments of
`jobsup start` must find as little as possible under way.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module of the package that defines it.
_EXPORTS = {
    "App": "app",
    "Handler": "app",
    "load_app": "app",
    "JobsupError": "errors",
    "Job": "job",
    "JobSpec": "job",
    "EnqueueOptions": "job",
    "AsyncQueue": "pooled",
    "Queue": "pooled",
    "aenqueue": "client",
    "aenqueue_many": "client",
    "enqueue": "client",
    "enqueue_many": "client",
    "dsn": "client",
    "Snooze": "outcomes",
    "RetryAfter": "outcomes",
    "Discard": "outcomes",
    "RunOutcome": "outcomes",
    "AttemptStopped": "outcomes",
    "Workflow": "workflow",
    "parents": "workflow",
    "aparents": "workflow",
    "children": "workflow",
    "achildren": "workflow",
}

__all__ = sorted([*_EXPORTS, "__version__"])

# For type checkers only: the `X as X` form marks each name as re-exported (mypy's no_implicit_reexport,
# ruff's F401), since neither reads the computed __all__ above.
if TYPE_CHECKING:
    from jobsup.app import App as App
    from jobsup.app import Handler as Handler
    from jobsup.app import load_app as load_app
    from jobsup.client import aenqueue as aenqueue
    from jobsup.client import aenqueue_many as aenqueue_many
    from jobsup.client import dsn as dsn
    from jobsup.client import enqueue as enqueue
    from jobsup.client import enqueue_many as enqueue_many
    from jobsup.errors import JobsupError as JobsupError
    from jobsup.job import EnqueueOptions as EnqueueOptions
    from jobsup.job import Job as Job
    from jobsup.job import JobSpec as JobSpec
    from jobsup.outcomes import AttemptStopped as AttemptStopped
    from jobsup.outcomes import Discard as Discard
    from jobsup.outcomes import RetryAfter as RetryAfter
    from jobsup.outcomes import RunOutcome as RunOutcome
    from jobsup.outcomes import Snooze as Snooze
    from jobsup.pooled import AsyncQueue as AsyncQueue
    from jobsup.pooled import Queue as Queue
    from jobsup.workflow import Workflow as Workflow
    from jobsup.workflow import achildren as achildren
    from jobsup.workflow import aparents as aparents
    from jobsup.workflow import children as children
    from jobsup.workflow import parents as parents


def __getattr__(name: str) -> Any:
    if name == "__version__":  # pyproject.toml is the one place the version is set
        from importlib.metadata import version

        globals()[name] = value = version("jobsup")
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jobsup' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
