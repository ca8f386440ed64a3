"""The import path of `migrate` in jobsup 0.1.0 (`from jobsup.migrate import migrate`), kept for one
release: each name read from here is the one of jobsup.db.migrate, with a DeprecationWarning that says
what to use instead. A test database is set up with `jobsup.testing.migrate`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# The names jobsup.migrate had in 0.1.0 (all of them now in the internal jobsup.db.migrate).
_NAMES = frozenset(
    {"migrate", "available", "LATEST", "MIGRATION_LOCK", "Migration", "schema_version", "require_schema"}
)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'jobsup.migrate' has no attribute {name!r}")
    instead = (
        "use jobsup.testing.migrate (a connection or a DSN), or the jobsup migrate command"
        if name == "migrate"
        else f"it is internal now (jobsup.db.migrate.{name})"
    )
    warnings.warn(f"jobsup.migrate.{name} goes in the next release: {instead}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("jobsup.db.migrate"), name)
