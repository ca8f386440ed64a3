"""Queue and AsyncQueue: enqueue through a pool of their own, each call committing on its own.

They enqueue through an App (an empty one when none is given, for its defaults and middleware), so they
sit above jobsup.app, which enqueues through jobsup.client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Unpack

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from jobsup.app import App
from jobsup.db import dsn as dsns
from jobsup.job import EnqueueOptions, JobSpec


class Queue:
    """`Queue(dsn).enqueue("email", {...})`: each call commits on its own. Pass `app` for its defaults."""

    def __init__(self, dsn: str | None = None, *, app: App | None = None, max_size: int = 4) -> None:
        self.app = app or App()
        self.pool = ConnectionPool(
            dsns.resolve(dsn),
            min_size=1,
            max_size=max_size,
            kwargs={"autocommit": True, "prepare_threshold": dsns.prepare_threshold()},
            open=True,
        )

    def enqueue(self, kind: str | JobSpec, payload: Any = None, **options: Unpack[EnqueueOptions]) -> int | None:
        with self.pool.connection() as conn:
            return self.app.enqueue(conn, kind, payload, **options)

    def enqueue_many(self, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[int | None]:
        with self.pool.connection() as conn:
            return self.app.enqueue_many(conn, jobs)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncQueue:
    """The asyncio form of Queue: `async with AsyncQueue(dsn) as q: await q.enqueue(...)`."""

    def __init__(self, dsn: str | None = None, *, app: App | None = None, max_size: int = 4) -> None:
        self.app = app or App()
        self.pool = AsyncConnectionPool(
            dsns.resolve(dsn),
            min_size=1,
            max_size=max_size,
            kwargs={"autocommit": True, "prepare_threshold": dsns.prepare_threshold()},
            open=False,
        )

    async def enqueue(self, kind: str | JobSpec, payload: Any = None, **options: Unpack[EnqueueOptions]) -> int | None:
        async with self.pool.connection() as conn:
            return await self.app.aenqueue(conn, kind, payload, **options)

    async def enqueue_many(self, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[int | None]:
        async with self.pool.connection() as conn:
            return await self.app.aenqueue_many(conn, jobs)

    async def __aenter__(self) -> AsyncQueue:
        await self.pool.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.close()
