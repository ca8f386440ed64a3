"""Enqueueing: the functions that take the caller's connection (Queue and AsyncQueue, which bring a pool,
are in jobsup.pooled).

On a connection inside the caller's transaction, the job is part of it: rolled back, the job never
existed; committed, it is there, and its NOTIFY goes out at commit. Each function has a sync and an
asyncio form that share one statement of `db/queries/jobs.sql`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack

import psycopg

from jobsup import middleware, workflow
from jobsup.db import dsn as dsns
from jobsup.db.sql import Op, arun, run, sorted_ids
from jobsup.job import EnqueueOptions, JobSpec, insert_columns, make_spec
from jobsup.middleware import HasMiddleware

OneJob = JobSpec | Mapping[str, Any]


def dsn() -> str:
    """The DSN of the database jobsup uses, for your own connections (`psycopg.connect(jobsup.dsn())`).

    In a handler run by `jobsup start`, its supervisor's database, whatever named it (`--dsn`,
    JOBSUP_DSN, DATABASE_URL or the embedded server): the supervisor exports it to its workers as
    JOBSUP_DSN. Elsewhere, as every jobsup command resolves it: JOBSUP_DSN, else DATABASE_URL, else the
    embedded PostgreSQL of JOBSUP_DATA_DIR or the per-user default, started if need be.
    """
    return dsns.resolve()


def _enqueue_op(spec: JobSpec) -> Op:
    params = {
        "queue": spec.queue,
        "kind": spec.kind,
        "payload": spec.encoded_payload(),
        "priority": spec.priority,
        "run_at": spec.run_at,
        "delay": float(spec.delay),
        "max_attempts": spec.max_attempts,
        "unique_key": spec.unique_key,
        "key": spec.key,
        "meta": spec.encoded_meta(),
    }
    return Op("enqueue", params, lambda rows: rows[0][0] if rows else None)


def _enqueue_many_op(specs: Sequence[JobSpec]) -> Op:
    params = insert_columns(specs)
    if all(s.unique_key is None for s in specs):
        # Nothing to skip: every input is inserted, in order, so the ascending ids are the answer.
        return Op("enqueue_many_unkeyed", params, sorted_ids)
    params["unique_keys"] = [s.unique_key for s in specs]

    def parse(rows: list[tuple]) -> list[int | None]:
        # Rows go in in input order, so ascending ids match the inserted inputs in order. An input was
        # inserted unless its unique_key was skipped: live already, or taken earlier in this batch.
        inserted_keys = {key for _, key in rows if key is not None}
        ids = iter(sorted(row[0] for row in rows))
        seen: set[str] = set()
        result: list[int | None] = []
        for spec in specs:
            key = spec.unique_key
            if key is None or (key in inserted_keys and key not in seen):
                if key is not None:
                    seen.add(key)
                result.append(next(ids))
            else:
                result.append(None)
        return result

    return Op("enqueue_many", params, parse)


def enqueue(
    conn: psycopg.Connection[Any], kind: str | JobSpec, payload: Any = None, **options: Unpack[EnqueueOptions]
) -> int | None:
    """Enqueue one job; its id, or None when its unique_key belongs to a queued or running job."""
    return enqueue_spec(conn, make_spec(kind, payload, options), None)


async def aenqueue(
    conn: psycopg.AsyncConnection[Any], kind: str | JobSpec, payload: Any = None, **options: Unpack[EnqueueOptions]
) -> int | None:
    """The asyncio form of enqueue."""
    return await aenqueue_spec(conn, make_spec(kind, payload, options), None)


def enqueue_many(conn: psycopg.Connection[Any], jobs: Iterable[OneJob]) -> list[int | None]:
    """Enqueue many jobs in one statement; per input, its id or None where its unique_key was skipped."""
    return enqueue_specs(conn, [make_spec(job) for job in jobs], None)


async def aenqueue_many(conn: psycopg.AsyncConnection[Any], jobs: Iterable[OneJob]) -> list[int | None]:
    """The asyncio form of enqueue_many."""
    return await aenqueue_specs(conn, [make_spec(job) for job in jobs], None)


# The forms of the functions above for checked JobSpecs, whose enqueue middleware are the process's
# (tracing) and `app`'s (None: the process's alone). App's enqueue functions call these.


def enqueue_spec(conn: psycopg.Connection[Any], spec: JobSpec, app: HasMiddleware | None) -> int | None:
    spec = middleware.stamp(spec, app)
    if spec.after:  # stamped already: the one-job workflow runs no middleware of its own
        return workflow.enqueue_dependents(conn, [spec])[0]
    return run(conn, _enqueue_op(spec))


async def aenqueue_spec(conn: psycopg.AsyncConnection[Any], spec: JobSpec, app: HasMiddleware | None) -> int | None:
    spec = middleware.stamp(spec, app)
    if spec.after:
        return (await workflow.aenqueue_dependents(conn, [spec]))[0]
    return await arun(conn, _enqueue_op(spec))


def enqueue_specs(conn: psycopg.Connection[Any], specs: list[JobSpec], app: HasMiddleware | None) -> list[int | None]:
    specs = middleware.stamp_all(specs, app)
    if any(spec.after for spec in specs):
        return workflow.enqueue_dependents(conn, specs)
    return run(conn, _enqueue_many_op(specs)) if specs else []


async def aenqueue_specs(
    conn: psycopg.AsyncConnection[Any], specs: list[JobSpec], app: HasMiddleware | None
) -> list[int | None]:
    specs = middleware.stamp_all(specs, app)
    if any(spec.after for spec in specs):
        return await workflow.aenqueue_dependents(conn, specs)
    return await arun(conn, _enqueue_many_op(specs)) if specs else []


# Queue and AsyncQueue enqueue through an App, which imports this module for its own enqueue: they moved
# up to jobsup.pooled. The old path works for one release, with a DeprecationWarning.
_MOVED = {"Queue", "AsyncQueue"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(
            f"jobsup.client.{name} moved to jobsup.pooled.{name} (jobsup.{name} is the same class); "
            "the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        from jobsup import pooled

        return getattr(pooled, name)
    raise AttributeError(f"module 'jobsup.client' has no attribute {name!r}")
