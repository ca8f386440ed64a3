"""What a handler receives, and what a caller describes when it enqueues."""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, NamedTuple, TypedDict

from jobsup.errors import BadInput, PayloadTooLarge
from jobsup.limits import check_key

# Largest payload accepted, as compact JSON bytes, unless JOBSUP_MAX_PAYLOAD says otherwise. A queue
# row is no place for files; pass a reference.
MAX_PAYLOAD_BYTES = 1_000_000
# Largest meta (what enqueue middleware store with a job), as compact JSON bytes: it is context (ids, a
# trace's traceparent), read by every run's middleware and shown with the job, not a second payload.
MAX_META_BYTES = 8192
_INT_MAX = 2**31 - 1  # PostgreSQL's integer, the type of priority and max_attempts
DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 3

# JSON's escape of U+0000 (not preceded by an escaped backslash): valid JSON that jsonb cannot store.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def max_payload_bytes() -> int:
    """JOBSUP_MAX_PAYLOAD, read where it is used so a bad value is one clear error of the command that
    needs it, not a traceback at import of every command (`--help` included)."""
    text = os.environ.get("JOBSUP_MAX_PAYLOAD", "").strip()
    if not text:
        return MAX_PAYLOAD_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise BadInput(f"JOBSUP_MAX_PAYLOAD must be a whole number of bytes, at least 1, not {text!r}")
    return value


class Job(NamedTuple):
    """A claimed job as its handler sees it. `attempts` is 1 on the first run.

    A named tuple rather than a frozen dataclass: as immutable, and built in a quarter of the time,
    which counts when a supervisor builds thousands a second (the claim returns its columns in this
    order, so a row becomes a Job as it is).
    """

    id: int
    kind: str
    payload: Any
    queue: str
    attempts: int
    max_attempts: int
    priority: int = 0
    run_at: datetime | None = None
    created_at: datetime | None = None
    # How many times a handler snoozed this job (each Snooze gave its attempt back).
    snoozes: int = 0
    # The job's earlier entries of `errors` (failed, interrupted, snoozed attempts), oldest first:
    # {attempt, at, error, traceback, by, snooze}. A handler sees a list, empty on a first run.
    errors: list[dict[str, Any]] | None = None
    started_at: datetime | None = None  # when this attempt was claimed: its queue latency is started_at - run_at
    # The job's key (an account, a customer): the per-key dimension of its kind's limits; None for none.
    key: str | None = None
    # What enqueue middleware stored with the job (jobsup.middleware): a dict, None for nothing. Last and
    # with a default, as the claim returns it, so a Job built by hand (a test's) need not give it.
    meta: dict[str, Any] | None = None


class Claimed(NamedTuple):
    """A claimed job as the supervisor holds it: the columns the claim returns, in Job's order, its JSON
    columns (payload, errors, meta) as the text PostgreSQL wrote. The supervisor never reads them: a
    worker parses them into the Job its handler sees (jobsup.worker.messages), in parallel, off the
    supervisor's one thread. jobsup.db.lifecycle's claim_text and claim_limited_text return these."""

    id: int
    kind: str
    payload: str
    queue: str
    attempts: int
    max_attempts: int
    priority: int
    run_at: datetime
    created_at: datetime
    snoozes: int
    errors: str | None  # NULL for a job with no history (the claim returns no empty list)
    started_at: datetime
    key: str | None
    meta: str | None


class EncodedPayload(str):
    """A payload that encoded_payload() has already encoded and checked, carried as its JSON text.

    The CLI checks every line of a file before it writes anything; keeping the text it made spares
    enqueue_many a second json.dumps per job (for 100,000 lines: 1.83 s of CPU became 1.59 s).
    """


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job to enqueue. `payload` is a JSON object (a dict; None means {}). `delay` (seconds) counts
    from `run_at`, or from now."""

    kind: str
    payload: Any = None
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    delay: float = 0.0
    run_at: datetime | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    unique_key: str | None = None
    key: str | None = None  # the per-key dimension of the kind's limits (jobsup.limits)
    # Ids of the jobs this one waits for (jobsup.workflow): it stays `waiting` until each has finished.
    after: tuple[int, ...] = ()
    # What a parent that ends dead or cancelled does to this job: "cancel" it, or let it "run".
    on_parent_failure: str = "cancel"
    # Context stored with the job, beside its payload: a dict, which enqueue middleware add to.
    meta: dict[str, Any] | None = None

    def encoded_payload(self, limit: int | None = None) -> str:
        """The payload as compact JSON, or BadInput if it is not JSON or is over the limit."""
        return encoded_json({} if self.payload is None else self.payload, f"payload of a {self.kind!r} job", limit)

    def encoded_meta(self) -> str | None:
        """The meta as compact JSON (None for none, or an empty one), or BadInput if it is not JSON or
        is over MAX_META_BYTES."""
        if not self.meta:
            return None
        return encoded_json(
            self.meta,
            f"meta of a {self.kind!r} job",
            MAX_META_BYTES,
            hint="meta is for context such as ids; data goes in the payload",
        )

    def validate(self) -> None:
        if not isinstance(self.kind, str) or not self.kind.strip():
            raise BadInput("a job needs a kind: a non-empty string")
        if not _is_object(self.payload):
            # Refused here, where every enqueue passes (the functions, App, Queue, the CLI's argument
            # and its lines), rather than accepted and then failing every attempt in a handler that
            # reads job.payload[...] or .get(...); schedules refuse them the same way.
            raise BadInput(
                f"payload of a {self.kind!r} job must be a JSON object (a dict), not {_type_name(self.payload)}"
            )
        if not isinstance(self.queue, str) or not self.queue.strip():
            raise BadInput(f"queue of a {self.kind!r} job must be a non-empty string")
        if (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not -_INT_MAX - 1 <= self.priority <= _INT_MAX
        ):
            raise BadInput(
                f"priority of a {self.kind!r} job must be a whole number from {-_INT_MAX - 1} "
                f"to {_INT_MAX}, not {self.priority!r}"
            )
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or not 1 <= self.max_attempts <= _INT_MAX
        ):
            raise BadInput(
                f"max_attempts of a {self.kind!r} job must be a whole number from 1 to {_INT_MAX}, "
                f"not {self.max_attempts!r}"
            )
        if isinstance(self.delay, bool) or not isinstance(self.delay, (int, float)) or not 0 <= self.delay < 1e10:
            raise BadInput(f"delay of a {self.kind!r} job must be a number of seconds >= 0")
        if self.run_at is not None and (not isinstance(self.run_at, datetime) or self.run_at.tzinfo is None):
            raise BadInput(f"run_at of a {self.kind!r} job must be a datetime with a time zone")
        if self.unique_key is not None and (not isinstance(self.unique_key, str) or not self.unique_key):
            raise BadInput(f"unique_key of a {self.kind!r} job must be a non-empty string")
        if self.key is not None:
            check_key(self.key, self.kind)
        if self.after or self.on_parent_failure != "cancel":
            check_dependencies(self)
        if self.meta is not None and not isinstance(self.meta, dict):
            raise BadInput(f"meta of a {self.kind!r} job must be a dict, not {_type_name(self.meta)}")


def insert_columns(specs: Sequence[JobSpec]) -> dict[str, Any]:
    """The arrays, one element per job, that a many-jobs insert unnests: enqueue_many's statements and
    a workflow's (jobsup/workflow.py)."""
    limit = max_payload_bytes()  # once per batch, not once per job
    return {
        "queues": [s.queue for s in specs],
        "kinds": [s.kind for s in specs],
        "payloads": [s.encoded_payload(limit) for s in specs],
        "priorities": [s.priority for s in specs],
        "run_ats": [s.run_at for s in specs],
        "delays": [float(s.delay) for s in specs],
        "max_attempts": [s.max_attempts for s in specs],
        # NULL when no job has one (as most batches): unnest pads a NULL array with NULLs.
        "keys": None if all(s.key is None for s in specs) else [s.key for s in specs],
        "metas": None if all(not s.meta for s in specs) else [s.encoded_meta() for s in specs],
    }


PARENT_FAILURE_POLICIES = ("cancel", "run")


def check_job_id(value: Any, what: str) -> int:
    """`value` as a job id (a whole number from 1), or BadInput naming `what` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**63 - 1:
        raise BadInput(f"{what} takes job ids (whole numbers from 1), not {value!r}")
    return value


def check_dependencies(spec: JobSpec) -> None:
    if isinstance(spec.after, (str, bytes)) or not isinstance(spec.after, (tuple, list)):
        raise BadInput(f"after= of a {spec.kind!r} job takes a list of job ids, not {spec.after!r}")
    for parent in spec.after:
        check_job_id(parent, f"after= of a {spec.kind!r} job")
    if spec.on_parent_failure not in PARENT_FAILURE_POLICIES:
        raise BadInput(
            f"on_parent_failure of a {spec.kind!r} job must be one of {', '.join(PARENT_FAILURE_POLICIES)}, "
            f"not {spec.on_parent_failure!r}"
        )
    if spec.unique_key is not None and spec.after:
        # The unique index covers queued and running jobs: a waiting one would slip past it.
        raise BadInput(f"a {spec.kind!r} job with after= cannot have a unique_key")


# What a non-object payload is called in a refusal: the Python type, and the JSON one for a reader of
# the CLI, whose payloads are JSON text.
_JSON_NAMES = {list: "a JSON array", tuple: "a JSON array", str: "a JSON string", bool: "true or false"}


def _is_object(payload: Any) -> bool:
    """None (meaning {}), a dict, or JSON text encoded from one (an EncodedPayload of the CLI's)."""
    if type(payload) is EncodedPayload:
        return payload.startswith("{")  # compact JSON of a dict, as encoded_json wrote it
    return payload is None or isinstance(payload, dict)


def _type_name(value: Any) -> str:
    """
    >>> _type_name([1]), _type_name(2.5), _type_name(True)
    ('list (a JSON array)', 'float (a JSON number)', 'bool (true or false)')
    """
    if type(value) is EncodedPayload:
        return "JSON that is not an object"
    kind = type(value)
    json_name = _JSON_NAMES.get(kind) or ("a JSON number" if kind in (int, float) else None)
    return f"{kind.__name__} ({json_name})" if json_name else kind.__name__


class EnqueueOptions(TypedDict, total=False):
    """The keyword options of every enqueue function: a misspelt one is a type error, and at run time a
    BadInput that names it. An option left out takes the handler's default (through an App or a Queue
    given one), else JobSpec's."""

    queue: str
    priority: int
    delay: float
    run_at: datetime | None
    max_attempts: int
    unique_key: str | None
    key: str | None
    after: Sequence[int]
    on_parent_failure: str
    meta: dict[str, Any] | None


OPTIONS = tuple(EnqueueOptions.__annotations__)
_SPEC_FIELDS = tuple(f.name for f in fields(JobSpec))
# For the check every job passes: a set's issuperset is one C call, where the loop that names the
# culprit costs a bulk enqueue of 20,000 jobs a few milliseconds.
_OPTION_SET, _SPEC_FIELD_SET = frozenset(OPTIONS), frozenset(_SPEC_FIELDS)


def _refuse_unknown(names: Mapping[str, Any], known: tuple[str, ...], what: str) -> None:
    """BadInput naming the first option that is not one of `known`, with the closest one it may mean.

    >>> _refuse_unknown({"priorty": 1}, OPTIONS, "enqueue")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    jobsup.errors.BadInput: enqueue has no option 'priorty' (did you mean 'priority'?);
    its options: queue, priority, delay, run_at, max_attempts, unique_key, key, after,
    on_parent_failure, meta
    """
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BadInput(f"{what} has no option {name!r}{hint}; its options: {', '.join(known)}")


def make_spec(
    kind: str | JobSpec | Mapping[str, Any],
    payload: Any = None,
    options: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> JobSpec:
    """The JobSpec of an enqueue call: a JobSpec as it is, or a kind with its payload and options, or a
    mapping of JobSpec's fields (one job of enqueue_many). `defaults` fill what the call leaves out."""
    if isinstance(kind, JobSpec):
        if options:
            raise BadInput(f"give the options of a {kind.kind!r} job in its JobSpec or as keywords, not both")
        spec = kind
    else:
        if isinstance(kind, Mapping):
            if not _SPEC_FIELD_SET.issuperset(kind):
                _refuse_unknown(kind, _SPEC_FIELDS, "a job of enqueue_many")
            given: Mapping[str, Any] = kind
        else:
            if options and not _OPTION_SET.issuperset(options):
                _refuse_unknown(options, OPTIONS, "enqueue")
            given = {"kind": kind, "payload": payload, **(options or {})}
        try:
            spec = JobSpec(**{**defaults, **given}) if defaults else JobSpec(**given)
        except TypeError as exc:  # no kind
            raise BadInput(f"not a job: {exc}") from None
    spec.validate()
    return spec


def encoded_json(
    value: Any,
    what: str,
    limit: int | None = None,
    error: type[Exception] = BadInput,
    hint: str = "JOBSUP_MAX_PAYLOAD",
) -> str:
    """`value` as compact JSON that jsonb can store, or `error` naming `what` (a job's payload, its
    return value) and why: not JSON, a NUL character, or over `limit` bytes (`hint`: what sets the
    limit, or what to do instead).

    >>> encoded_json({"a": [1, None]}, "payload")
    '{"a":[1,null]}'
    >>> encoded_json({1, 2}, "return value of a 'x' job")
    Traceback (most recent call last):
    ...
    jobsup.errors.BadInput: return value of a 'x' job is not JSON: Object of type set is not JSON serializable
    """
    limit = max_payload_bytes() if limit is None else limit
    if type(value) is EncodedPayload:  # checked when it was encoded
        text = str(value)
    else:
        try:
            text = json.dumps(value, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise error(f"{what} is not JSON: {exc}") from None
        if "\\u0000" in text and _NUL_ESCAPE.search(text):
            raise error(f"{what} holds a NUL character (\\u0000), which PostgreSQL cannot store in jsonb")
    if len(text) > limit:  # json.dumps escapes non-ASCII, so characters are bytes
        too_large = PayloadTooLarge if error is BadInput else error
        raise too_large(f"{what} is {len(text)} bytes, over the limit of {limit} ({hint})")
    return text
