"""Ready jobs that no live supervisor can run: no supervisor serves their queue with an app that handles
their kind. A supervisor claims only the kinds its app handles (and every kind when its app finds them
by name, as Django's tasks do), so such jobs wait, attempts untouched, until one that can starts: in a
rolling deploy, the jobs of a kind that only the new release handles, until its first supervisor is up.
`jobsup doctor`, `jobsup check` and the console name them and say how long they have waited.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.durations import format_age

# A supervisor whose heartbeat is older than this does not count as serving anything (its row may be
# a dead one's that has not been removed yet). doctor's --stale-after has the same default.
STALE_AFTER = 30.0


@dataclass(frozen=True)
class Unserved:
    queue: str
    kind: str
    ready: int  # jobs of this kind ready in this queue
    age: float  # seconds the oldest of them has been ready

    def describe(self) -> str:
        """One line for a person.

        >>> Unserved("mix", "newkind", 2, 75.0).describe()
        'queue mix: 2 ready jobs of kind newkind that no live supervisor can run, the oldest for 1m15s'
        """
        jobs = f"{self.ready} ready job{'s' if self.ready != 1 else ''}"
        return (
            f"queue {self.queue}: {jobs} of kind {self.kind} that no live supervisor can run, "
            f"the oldest for {format_age(self.age)}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def unserved(conn: psycopg.Connection[Any], stale_after: float = STALE_AFTER) -> list[Unserved]:
    """The ready jobs no live supervisor can run, by queue and kind. Reads every ready job once: for
    doctor and check, not for a loop."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SQL["unserved"], {"stale_after": stale_after})
        return [Unserved(**row) for row in cur.fetchall()]
