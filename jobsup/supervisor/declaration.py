"""Records the limits the app declares, once its first worker has imported it and before the first claim:
a kind whose app declares a limit is never claimed past it, even by a supervisor's first claim.

The database holds what is in force (jobsup/ops/limits.py says who wins when apps or an operator
disagree); this logs what the declaration changed, and what it could not (an operator's values win).
"""

from __future__ import annotations

import asyncio

import psycopg

from jobsup.db.dsn import connect
from jobsup.errors import DatabaseUnavailable
from jobsup.limits import Limits
from jobsup.ops import limits
from jobsup.supervisor.keeper import Keeper
from jobsup.supervisor.log import EventLog

# Between tries when the database cannot take the declaration: claims wait for it.
RETRY = 1.0


class Declaration:
    def __init__(self, dsn: str, log: EventLog, supervisor_id: str, keeper: Keeper) -> None:
        self.dsn = dsn
        self.log = log
        self.id = supervisor_id
        self.keeper = keeper

    async def record(self) -> tuple[list[str], list[str]] | None:
        """Record the app's limits; the kinds with a limit in force after it and those of them with
        per-key limits, or None if the database could not take it (logged; the caller tries again after
        RETRY)."""
        try:
            changes, in_force = await asyncio.to_thread(self._record)
        except (psycopg.Error, DatabaseUnavailable, OSError) as exc:
            self.log("limits.error", "error", error=str(exc).strip().splitlines()[0])
            return None
        for change in changes:
            if change.set_by is not None and change.declared is not None and change.declared != change.after:
                self.log(
                    "limit.overridden",
                    "warning",
                    kind=change.kind,
                    declared=str(change.declared),
                    in_force=str(change.after),
                    set_by=change.set_by,
                )
            elif change.before != change.after:
                self.log("limit.declared", kind=change.kind, limits=str(change.after), was=str(change.before))
        return in_force

    def _record(self) -> tuple[list[limits.Change], tuple[list[str], list[str]]]:
        declared = {kind: Limits.from_json(kind, data) for kind, data in self.keeper.limits.items()}
        # A transaction pooler may hand each transaction to another server connection: no statement is
        # prepared on one.
        with connect(self.dsn, prepare_threshold=None) as conn:
            changes = limits.declare(conn, declared, self.keeper.kinds or (), self.id)
            return changes, limits.kinds_in_force(conn)
