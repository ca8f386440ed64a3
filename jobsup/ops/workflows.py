"""Reading workflows: one with its jobs and their parents (`jobsup workflow ID`, the console's tree), and
the newest ones with their progress (`jobsup workflow`, the console's list)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from jobsup.db.sql import STATEMENTS as SQL
from jobsup.errors import BadInput


class Member(NamedTuple):
    """A job of a workflow."""

    id: int
    kind: str
    status: str
    attempts: int
    max_attempts: int
    created_at: datetime
    started_at: datetime | None
    done_at: datetime | None
    last_error: str | None
    parents_left: int
    parents: list[int]


class WorkflowView(NamedTuple):
    id: int
    name: str | None
    created_at: datetime
    finished_at: datetime | None
    failed: bool | None
    members: list[Member]

    def counts(self) -> Counter[str]:
        """Its jobs by status."""
        return Counter(m.status for m in self.members)


class Progress(NamedTuple):
    """A workflow and its jobs counted: failed is those that ended dead or cancelled."""

    id: int
    name: str | None
    created_at: datetime
    finished_at: datetime | None
    total: int
    done: int
    failed: int
    running: int
    queued: int
    waiting: int


def show(conn: psycopg.Connection[Any], workflow_id: int) -> WorkflowView:
    """The workflow and its jobs, by id; BadInput when there is no such workflow."""
    row = conn.execute(SQL["workflow_row"], {"id": workflow_id}).fetchone()
    if row is None:
        raise BadInput(f"no workflow {workflow_id}")
    members = [Member(*r) for r in conn.execute(SQL["workflow_members"], {"id": workflow_id})]
    return _view(row, members)


async def ashow(conn: psycopg.AsyncConnection[Any], workflow_id: int) -> WorkflowView:
    cur = await conn.execute(SQL["workflow_row"], {"id": workflow_id})
    row = await cur.fetchone()
    if row is None:
        raise BadInput(f"no workflow {workflow_id}")
    cur = await conn.execute(SQL["workflow_members"], {"id": workflow_id})
    return _view(row, [Member(*r) for r in await cur.fetchall()])


def _view(row: tuple[Any, ...], members: list[Member]) -> WorkflowView:
    workflow_id, name, created_at, finished_at, failed = row
    return WorkflowView(workflow_id, name, created_at, finished_at, failed, members)


def recent(conn: psycopg.Connection[Any], limit: int = 20) -> list[Progress]:
    """The newest `limit` workflows, newest first."""
    return [Progress(*r) for r in conn.execute(SQL["workflows_recent"], {"limit": limit})]


async def arecent(conn: psycopg.AsyncConnection[Any], limit: int = 20) -> list[Progress]:
    cur = await conn.execute(SQL["workflows_recent"], {"limit": limit})
    return [Progress(*r) for r in await cur.fetchall()]
