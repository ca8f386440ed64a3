"""Workflows: jobs that wait for other jobs, enqueued together in the caller's transaction.

    wf = app.workflow("album")
    sizes = [wf.add("resize", {"path": p}) for p in paths]
    wf.add("album", {"name": "summer"}, after=sizes)
    workflow_id = wf.enqueue(conn)

A job with parents is `waiting` until every one has finished; the outcome write that finishes its last
one makes it `queued`, in the same transaction (the schema's trigger, migration 0009). A parent that
ends dead or cancelled cancels its children by default; `on_parent_failure="run"` runs them anyway.
`enqueue(..., after=[ids])` is the one-job form, for jobs that already exist.

Every enqueue here checks what it names (ids that exist, jobs still waiting, no cycle) before it writes
anything, and writes in a savepoint of the caller's transaction: a BadInput leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import psycopg
from psycopg.pq import TransactionStatus

from jobsup import middleware
from jobsup.db.sql import Op, arun, arun_steps, run, run_steps
from jobsup.errors import BadInput
from jobsup.job import PARENT_FAILURE_POLICIES, Job, JobSpec, check_job_id, insert_columns, make_spec
from jobsup.middleware import Middleware

Step = str | JobSpec | Mapping[str, Any]


class WorkflowApp(Protocol):
    """What a workflow needs of its app (jobsup.app.App, which imports this module for app.workflow()):
    its enqueue middleware, and its handler defaults for a job, refusing a kind it has no handler for."""

    @property
    def middleware(self) -> Middleware: ...

    def _known_spec(
        self, kind: str | JobSpec | Mapping[str, Any], payload: Any = None, options: Mapping[str, Any] | None = None
    ) -> JobSpec: ...


# Outside autocommit, the caller's transaction begins with its first statement; psycopg's transaction()
# on a connection with none begun would begin one of its own and commit it at its end. This statement
# begins the caller's, so the savepoint that every enqueue here writes in is inside it.
_BEGIN = "SELECT 'jobsup: joining the caller''s transaction'"


class Ref:
    """A job of a Workflow not yet enqueued; `id` is its job id once the workflow is."""

    __slots__ = ("_workflow", "id", "index", "spec")

    def __init__(self, workflow: Workflow, index: int, spec: JobSpec) -> None:
        self._workflow = workflow
        self.index = index
        self.spec = spec
        self.id: int | None = None

    def __repr__(self) -> str:
        return f"<Ref {self.spec.kind!r} #{self.index}{'' if self.id is None else f' id={self.id}'}>"


Parents = Ref | int | Iterable[Ref | int]


class Group(NamedTuple):
    """What Workflow.group adds: its members and the job that runs after all of them (or None)."""

    members: list[Ref]
    then: Ref | None


class Parent(NamedTuple):
    """A parent of a job as its child sees it: how it ended and what it returned."""

    id: int
    kind: str
    status: str
    return_value: Any
    last_error: str | None
    done_at: datetime | None
    on_parent_failure: str


class Child(NamedTuple):
    id: int
    kind: str
    status: str
    on_parent_failure: str


class Workflow:
    """A set of jobs with dependencies among them, enqueued together by `enqueue(conn)`.

    `add` takes what `enqueue` takes, plus `after=` (Refs of this workflow, or ids of jobs that exist)
    and `before=` (Refs, or ids of waiting jobs that must now also wait for this one). A workflow made
    by `Workflow.extending(job)` adds its jobs to the workflow of `job`, a job running now: a handler
    adds work that it finds only at run time, and can make a later job wait for it.
    """

    def __init__(
        self, name: str | None = None, *, app: WorkflowApp | None = None, on_parent_failure: str = "cancel"
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise BadInput(f"a workflow's name must be a non-empty string, not {name!r}")
        if on_parent_failure not in PARENT_FAILURE_POLICIES:
            raise BadInput(
                f"on_parent_failure must be one of {', '.join(PARENT_FAILURE_POLICIES)}, not {on_parent_failure!r}"
            )
        self.name = name
        self.app = app
        self.on_parent_failure = on_parent_failure
        self.refs: list[Ref] = []
        # (parent, child, policy): a parent or child is a Ref of this workflow or the id of a job that exists.
        self.edges: list[tuple[Ref | int, Ref | int, str]] = []
        self.extends: int | None = None
        self._standalone = False  # the job of `enqueue(..., after=...)`: no workflow row
        self.id: int | None = None  # set by enqueue

    @classmethod
    def extending(
        cls, job: Job | int, *, app: WorkflowApp | None = None, on_parent_failure: str = "cancel"
    ) -> Workflow:
        """A Workflow whose jobs join the workflow of `job` (a Job, or its id)."""
        workflow = cls(app=app, on_parent_failure=on_parent_failure)
        workflow.extends = check_job_id(job.id if isinstance(job, Job) else job, "Workflow.extending")
        return workflow

    def add(
        self,
        kind: str | JobSpec,
        payload: Any = None,
        *,
        after: Parents = (),
        before: Parents = (),
        on_parent_failure: str | None = None,
        **options: Any,
    ) -> Ref:
        """Add one job; it runs after every job of `after` has finished, and every job of `before` runs
        after it."""
        if "after" in options or "unique_key" in options:
            name = "after" if "after" in options else "unique_key"
            raise BadInput(f"Workflow.add: {name} is not an option here")
        spec = self._spec(kind, payload, options)
        policy = self.on_parent_failure if on_parent_failure is None else on_parent_failure
        if policy not in PARENT_FAILURE_POLICIES:
            raise BadInput(
                f"on_parent_failure of a {spec.kind!r} job must be one of "
                f"{', '.join(PARENT_FAILURE_POLICIES)}, not {policy!r}"
            )
        ref = Ref(self, len(self.refs), spec)
        for parent in self._members(after, "after"):
            self.edges.append((parent, ref, policy))
        for child in self._members(before, "before"):
            self.edges.append((ref, child, policy))
        self.refs.append(ref)
        return ref

    def chain(self, *steps: Step, after: Parents = ()) -> list[Ref]:
        """Jobs that run one after the other, the first after `after`."""
        refs: list[Ref] = []
        previous: Parents = after
        for step in steps:
            ref = self.add(self._spec(step))
            for parent in self._members(previous, "after"):
                self.edges.append((parent, ref, self.on_parent_failure))
            refs.append(ref)
            previous = ref
        return refs

    def group(self, members: Iterable[Step], *, then: Step | None = None, after: Parents = ()) -> Group:
        """Jobs that run side by side (after `after`), and `then`, run once after all of them."""
        refs = [self.add(self._spec(member), after=after) for member in members]
        callback = None if then is None else self.add(self._spec(then), after=refs)
        return Group(refs, callback)

    def enqueue(self, conn: psycopg.Connection[Any]) -> int | None:
        """Write the workflow in `conn`'s transaction (a savepoint of it); its id (None for jobs added
        with `after=` alone). Each Ref's `id` is set."""
        steps = self._steps()
        _join(conn)
        with conn.transaction():
            return run_steps(conn, steps)

    async def aenqueue(self, conn: psycopg.AsyncConnection[Any]) -> int | None:
        """The asyncio form of enqueue."""
        steps = self._steps()
        await _ajoin(conn)
        async with conn.transaction():
            return await arun_steps(conn, steps)

    # What follows is shared by enqueue and aenqueue: the statements to run, each sent the rows of the one
    # before.

    def _steps(self) -> Generator[Op, Any, int | None]:
        if self.id is not None:
            raise BadInput(f"workflow {self.id} is enqueued already")
        if not self.refs:
            raise BadInput("a workflow needs at least one job")
        self._merge_edges()
        self._refuse_cycle()
        # The enqueue middleware of the process and the app, once per job, as any enqueue runs them; the
        # one-job workflow of `enqueue(..., after=)` has its job's meta from that enqueue already.
        specs = [ref.spec for ref in self.refs]
        if not self._standalone:
            specs = middleware.stamp_all(specs, self.app)
        existing = sorted({n for p, c, _ in self.edges for n in (p, c) if isinstance(n, int)})
        if self.extends is not None:
            existing = sorted({*existing, self.extends})
        known: dict[int, tuple[str, int | None]] = {}
        if existing:
            known = yield Op("workflow_known_jobs", {"ids": existing}, lambda rows: {r[0]: (r[1], r[2]) for r in rows})
        missing = [i for i in existing if i not in known]
        if missing:
            raise BadInput(f"no job {missing[0]}: after= and before= take ids of jobs that exist")
        workflow_id = None
        if self.extends is not None:
            workflow_id = known[self.extends][1]
            if workflow_id is None:
                raise BadInput(f"job {self.extends} is not part of a workflow: nothing to extend")
        more: dict[int, int] = {}  # a waiting job given new parents by before=: how many
        for _, child, _ in self.edges:
            if isinstance(child, int):
                status = known[child][0]
                if status != "waiting":
                    raise BadInput(f"job {child} is {status}: only a waiting job can be made to wait for more")
                more[child] = more.get(child, 0) + 1
        parents_left = [0] * len(self.refs)
        has_children = [False] * len(self.refs)
        for parent, child, _ in self.edges:
            if isinstance(child, Ref):
                parents_left[child.index] += 1
            if isinstance(parent, Ref):
                has_children[parent.index] = True
        create = self.extends is None and not self._standalone
        rows = yield Op(
            "workflow_insert",
            {
                "name": self.name,
                "create": create,
                "workflow_id": workflow_id,
                **insert_columns(specs),
                "parents_left": parents_left,
                "has_children": has_children,
            },
            lambda rows: sorted(rows),
        )
        for ref, (job_id, _) in zip(self.refs, rows, strict=True):
            ref.id = job_id
        if more:
            ids = sorted(more)
            grown = yield Op("workflow_wait_for_more", {"ids": ids, "counts": [more[i] for i in ids]}, _ids)
            if len(grown) != len(ids):
                late = min(set(ids) - set(grown))
                raise BadInput(f"job {late} is no longer waiting: it cannot be made to wait for more")
        if self.edges:
            yield Op(
                "workflow_add_dependencies",
                {
                    "parents": [_id_of(p) for p, _, _ in self.edges],
                    "children": [_id_of(c) for _, c, _ in self.edges],
                    "policies": [policy for _, _, policy in self.edges],
                    "externals": [isinstance(p, int) for p, _, _ in self.edges],
                },
                lambda rows: None,
            )
        self.id = rows[0][1]
        return self.id

    def _spec(self, kind: Step, payload: Any = None, options: Mapping[str, Any] | None = None) -> JobSpec:
        if isinstance(kind, JobSpec) and not options and payload is None:
            spec = kind
        elif self.app is not None:
            spec = self.app._known_spec(kind, payload, options)
        else:
            spec = make_spec(kind, payload, options)
        if spec.after or spec.unique_key is not None:
            raise BadInput(
                f"a {spec.kind!r} job of a workflow takes its parents from after= of Workflow.add, "
                "and has no unique_key"
            )
        return spec

    def _members(self, given: Parents, what: str) -> list[Ref | int]:
        items: Iterable[Ref | int] = [given] if isinstance(given, (Ref, int)) else given
        members: list[Ref | int] = []
        for item in items:
            if isinstance(item, Ref):
                if item._workflow is not self:
                    raise BadInput(f"{what}= names a job of another workflow: {item!r}")
                members.append(item)
            else:
                members.append(check_job_id(item, f"{what}="))
        return members

    def _merge_edges(self) -> None:
        """One edge per parent and child: `after=[a, a]` means after a, once. (Both ends of an edge are
        named in one call, so the copies of a pair have one policy.)"""
        seen: set[tuple[tuple[str, int], tuple[str, int]]] = set()
        merged: list[tuple[Ref | int, Ref | int, str]] = []
        for parent, child, policy in self.edges:
            pair = (_node_key(parent), _node_key(child))
            if pair not in seen:
                seen.add(pair)
                merged.append((parent, child, policy))
        self.edges = merged

    def _refuse_cycle(self) -> None:
        """BadInput when the dependencies among this workflow's own jobs go round (Kahn's algorithm)."""
        children: list[list[int]] = [[] for _ in self.refs]
        waiting = [0] * len(self.refs)
        for parent, child, _ in self.edges:
            if isinstance(parent, Ref) and isinstance(child, Ref):
                children[parent.index].append(child.index)
                waiting[child.index] += 1
        ready = [i for i, n in enumerate(waiting) if n == 0]
        seen = 0
        while ready:
            node = ready.pop()
            seen += 1
            for child in children[node]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        if seen < len(self.refs):
            stuck = [self.refs[i] for i, n in enumerate(waiting) if n > 0]
            names = ", ".join(f"{r.spec.kind} #{r.index}" for r in stuck[:5])
            raise BadInput(f"the workflow's dependencies go round in a cycle, through {names}")


def _join(conn: psycopg.Connection[Any]) -> None:
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        conn.execute(_BEGIN)


async def _ajoin(conn: psycopg.AsyncConnection[Any]) -> None:
    if not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE:
        await conn.execute(_BEGIN)


def _node_key(node: Ref | int) -> tuple[str, int]:
    """A node of the graph as a key: a Ref by its place in its workflow, an existing job by its id."""
    return ("ref", node.index) if isinstance(node, Ref) else ("job", node)


def _id_of(node: Ref | int) -> int:
    if isinstance(node, Ref):
        assert node.id is not None  # set by the insert, which comes first
        return node.id
    return node


def _ids(rows: list[tuple[Any, ...]]) -> list[int]:
    return [row[0] for row in rows]


def dependent_workflow(spec: JobSpec) -> Workflow:
    """The one-job Workflow behind `enqueue(..., after=[ids])`."""
    workflow = Workflow()
    workflow._standalone = True
    ref = workflow.add(spec.kind, spec.payload, **_options(spec))
    for parent in spec.after:
        workflow.edges.append((parent, ref, spec.on_parent_failure))
    return workflow


def _options(spec: JobSpec) -> dict[str, Any]:
    return {
        "queue": spec.queue,
        "priority": spec.priority,
        "delay": spec.delay,
        "run_at": spec.run_at,
        "max_attempts": spec.max_attempts,
        "key": spec.key,
        "meta": spec.meta,
    }


def _parents_op(job: Job | int) -> Op:
    job_id = check_job_id(job.id if isinstance(job, Job) else job, "parents")
    return Op("job_parents", {"id": job_id}, lambda rows: [Parent(*row) for row in rows])


def _children_op(job: Job | int) -> Op:
    job_id = check_job_id(job.id if isinstance(job, Job) else job, "children")
    return Op("job_children", {"id": job_id}, lambda rows: [Child(*row) for row in rows])


def parents(conn: psycopg.Connection[Any], job: Job | int) -> list[Parent]:
    """The jobs `job` waits (or waited) for: how each ended and what it returned, by id."""
    return run(conn, _parents_op(job))


async def aparents(conn: psycopg.AsyncConnection[Any], job: Job | int) -> list[Parent]:
    return await arun(conn, _parents_op(job))


def children(conn: psycopg.Connection[Any], job: Job | int) -> list[Child]:
    """The jobs that wait (or waited) for `job`, by id."""
    return run(conn, _children_op(job))


async def achildren(conn: psycopg.AsyncConnection[Any], job: Job | int) -> list[Child]:
    return await arun(conn, _children_op(job))


def enqueue_dependents(conn: psycopg.Connection[Any], specs: Sequence[JobSpec]) -> list[int | None]:
    """enqueue and enqueue_many, for jobs some of which have after=: each as its own one-job Workflow,
    all in one savepoint."""
    _join(conn)
    with conn.transaction():
        return [_enqueue_one(conn, spec) for spec in specs]


def _enqueue_one(conn: psycopg.Connection[Any], spec: JobSpec) -> int | None:
    workflow = dependent_workflow(spec)
    workflow.enqueue(conn)
    return workflow.refs[0].id


async def aenqueue_dependents(conn: psycopg.AsyncConnection[Any], specs: Sequence[JobSpec]) -> list[int | None]:
    await _ajoin(conn)
    async with conn.transaction():
        ids: list[int | None] = []
        for spec in specs:
            workflow = dependent_workflow(spec)
            await workflow.aenqueue(conn)
            ids.append(workflow.refs[0].id)
        return ids
