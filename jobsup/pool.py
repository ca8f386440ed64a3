"""Enqueueing on the queue's own connection pool, for callers that have no connection of their own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from . import dsn as dsns
from .app import App
from .job import JobSpec

_EMPTY_APP = App()


class Queue:
    """`Queue(dsn).enqueue("email", {...})`: each call commits on its own. Pass `app` for its defaults."""

    def __init__(self, dsn: str | None = None, *, app: App | None = None, max_size: int = 4) -> None:
        self.app = app or _EMPTY_APP
        self.pool = ConnectionPool(dsns.resolve(dsn), min_size=1, max_size=max_size,
                                   kwargs={"autocommit": True, "prepare_threshold": dsns.prepare_threshold()},
                                   open=True)

    def enqueue(self, kind: str, payload: Any = None, **opts: Any) -> int | None:
        with self.pool.connection() as conn:
            return self.app.enqueue(conn, kind, payload, **opts)

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
        self.app = app or _EMPTY_APP
        self.pool = AsyncConnectionPool(dsns.resolve(dsn), min_size=1, max_size=max_size,
                                        kwargs={"autocommit": True, "prepare_threshold": dsns.prepare_threshold()},
                                        open=False)

    async def enqueue(self, kind: str, payload: Any = None, **opts: Any) -> int | None:
        async with self.pool.connection() as conn:
            return await self.app.aenqueue(conn, kind, payload, **opts)

    async def enqueue_many(self, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[int | None]:
        async with self.pool.connection() as conn:
            return await self.app.aenqueue_many(conn, jobs)

    async def __aenter__(self) -> AsyncQueue:
        await self.pool.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.close()
