"""Queue latency and run time per kind: fixed log-spaced histograms, one per kind per minute.

The supervisor sees every job's claim and finish, so it counts both figures into histograms as it goes
(`Recorder`) and adds them to the current 1-minute and 10-minute rows of `jobsup.latency` with its
outcome writes, at most once a second and in the same round trip (supervisor/writer.py). Every supervisor adds
to the same rows, so reading merges them all; reading sums 14 rows per kind and figure (seven of each
period), whatever the jobs table holds.

- queue latency: started_at - run_at, both the database's clock: how long a ready job waited for a worker;
- run time: from handing the job to a worker to hearing its outcome, the supervisor's clock.

The bounds: every decade from 10 us to 100,000 s is cut at the same 70 mantissas, about 2.5-5% apart,
so a percentile read between two bounds is within 2.5% of the truth (0.25 ms at 10 ms, 2.5 ms at
100 ms), and the Prometheus buckets (1, 2.5, 5 in each decade) are sums of whole fine buckets.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobsup.db.sql import STATEMENTS as SQL

# Upper bounds of one decade's buckets, in hundredths of its unit: 1.05 to 2 by 0.05, to 5 by 0.1,
# to 10 by 0.25. Integers, so a bound such as 2.5 ms is exact rather than 2.5 * 0.001.
_MANTISSAS = [105 + 5 * i for i in range(20)] + [210 + 10 * i for i in range(30)] + [525 + 25 * i for i in range(20)]
_PER_DECADE = len(_MANTISSAS)
LOWEST_DECADE = -5  # bucket 0 is (0, 10 us]
DECADES = 10  # up to 100,000 s (27 h); beyond is one overflow bucket
OVERFLOW = 1 + DECADES * _PER_DECADE  # index of the bucket past the last bound
_LOWEST = 10.0**LOWEST_DECADE

METRICS = ("queue_latency", "run_time")
# Minutes read back. The 1- and 5-minute windows are the current minute and the N whole minutes before
# it; the hour is the current 10 minutes and the six periods of 10 before them (60 to 70 minutes). Each
# is named by window_label, the one name `jobsup stats` and the console show; `--json` keys them 1m, 5m
# and 60m.
WINDOWS = (1, 5, 60)


def window_label(window: int) -> str:
    """What a window covers, as every view names it: its whole minutes (or 10-minute periods) and the
    current one so far, so "1m–2m" is between 60 and 120 seconds, depending on when in the minute it is
    read. A window read in the rows' own unit cannot say "the last 60 s": a minute's jobs are one count.

    >>> [window_label(w) for w in WINDOWS]
    ['1m–2m', '5m–6m', '60m–70m']
    """
    period = 10 if window >= 60 else 1  # the hour is read from the 10-minute rows (latency_read)
    return f"{window}m–{window + period}m"


# The figures are added to the database at most this often per supervisor (seconds): a few rows a
# second whatever the rate of jobs.
WRITE_EVERY = 1.0
# Each row is kept this many of its periods: 12 minutes of 1-minute rows, 2 hours of 10-minute rows,
# beyond what any window reads. Older rows are deleted by the pruner duty of every supervisor.
KEEP_PERIODS = 12
# A kind's latency is rising when its p95 of the last minute passes the p95 of the five minutes before
# by half again plus this much (seconds): a backlog building, not noise on a fast queue.
RISING_MARGIN = 0.05
RISING_FACTOR = 1.5
PERCENTILES = (0.5, 0.95, 0.99)


def _bound(index: int) -> float:
    if index <= 0:
        return _LOWEST
    if index >= OVERFLOW:
        return math.inf
    decade, k = divmod(index - 1, _PER_DECADE)
    exponent = LOWEST_DECADE + decade - 2  # mantissas are in hundredths
    return _MANTISSAS[k] * 10.0**exponent if exponent >= 0 else _MANTISSAS[k] / 10.0**-exponent


_BOUNDS = [_bound(i) for i in range(OVERFLOW + 1)]  # the upper bound of each bucket, the last infinite


def bound(index: int) -> float:
    """The upper bound (seconds) of bucket `index`; infinity for the overflow bucket.

    >>> bound(0), bound(1), bound(70), bound(1 + 3 * 70 + 24), bound(OVERFLOW)
    (1e-05, 1.05e-05, 0.0001, 0.025, inf)
    """
    return _BOUNDS[min(max(index, 0), OVERFLOW)]


def bucket(seconds: float) -> int:
    """The bucket of a duration: the first whose upper bound is at least it. A binary search of the
    bounds, a few hundred nanoseconds: the supervisor calls it twice per job.

    >>> [bucket(s) for s in (0, 1e-5, 0.0100, 0.0101, 0.025, 0.1, 1e9)] == [0, 0, 210, 211, 235, 280, OVERFLOW]
    True
    >>> all(bound(bucket(x) - 1) < x <= bound(bucket(x)) for x in (0.00999, 0.01, 0.0123, 0.099, 2.5, 3600.0))
    True
    """
    return bisect_left(_BOUNDS, seconds)


@dataclass
class Histogram:
    """Counts by bucket index, with their total and the sum of the values (for Prometheus' _sum)."""

    counts: dict[int, int] = field(default_factory=dict)
    total: int = 0
    sum: float = 0.0

    def observe(self, seconds: float) -> None:
        i = bucket(seconds)
        self.counts[i] = self.counts.get(i, 0) + 1
        self.total += 1
        self.sum += seconds

    def add(self, buckets: Iterable[int], counts: Iterable[int]) -> None:
        for i, n in zip(buckets, counts, strict=True):  # pairs: a count for each bucket
            if n:
                self.counts[i] = self.counts.get(i, 0) + n
                self.total += n

    def percentile(self, q: float) -> float | None:
        """The q-quantile (0.5 for p50), read linearly within its bucket; None when empty.

        >>> h = Histogram()
        >>> for ms in range(1, 101): h.observe(ms / 1000)
        >>> round(h.percentile(0.5) * 1000, 1), round(h.percentile(0.99) * 1000, 1)
        (50.0, 99.2)
        """
        if not self.total:
            return None
        rank = q * self.total
        seen = 0
        for i in sorted(self.counts):
            n = self.counts[i]
            if seen + n >= rank:
                low = bound(i - 1) if i > 0 else 0.0
                high = bound(i)
                if math.isinf(high):
                    return low
                return low + (high - low) * max(0.0, rank - seen) / n
            seen += n
        return bound(max(self.counts))

    def cumulative(self, bounds: Sequence[float]) -> list[int]:
        """Counts at or below each of `bounds` (each a bucket bound): Prometheus' `le` buckets.

        >>> h = Histogram(); h.observe(0.004); h.observe(0.005); h.observe(0.006)
        >>> h.cumulative([0.0025, 0.005, 0.01])
        [0, 2, 3]
        """
        limits = [bucket(b) for b in bounds]
        out = [0] * len(limits)
        for i, n in self.counts.items():
            for j, limit in enumerate(limits):
                if i <= limit:
                    out[j] += n
        return out


class _Pending:
    """One (kind, metric)'s counts since the last write, and the sum of their seconds."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.sum = 0.0


class Recorder:
    """What a supervisor counted since its last write, per (kind, metric); and, when `keep_totals`,
    everything since it started (the Prometheus histograms of --metrics-port). A job costs the same
    either way: what is written is folded into the totals once a second, and a scrape adds what is
    still pending."""

    def __init__(self, *, keep_totals: bool = False) -> None:
        self.pending: dict[tuple[str, str], _Pending] = {}
        self.totals: dict[tuple[str, str], Histogram] | None = {} if keep_totals else None
        self.written_at = -math.inf  # loop clock of the last write

    def record(self, kind: str, metric: str, seconds: float) -> None:
        pending = self.pending.get((kind, metric))
        if pending is None:
            pending = self.pending[(kind, metric)] = _Pending()
        counts = pending.counts
        i = bisect_left(_BOUNDS, seconds)
        counts[i] = counts.get(i, 0) + 1
        pending.sum += seconds

    def take(self, now: float, *, force: bool = False) -> dict[str, list] | None:
        """The parameters of `latency_merge` for what is pending, if a write is due (or `force`d);
        None when nothing is pending or the last write was under WRITE_EVERY ago."""
        if not self.pending or (not force and now - self.written_at < WRITE_EVERY):
            return None
        params: dict[str, list] = {"kinds": [], "metrics": [], "buckets": [], "counts": []}
        for (kind, metric), pending in sorted(self.pending.items()):
            for i, n in pending.counts.items():
                params["kinds"].append(kind)
                params["metrics"].append(metric)
                params["buckets"].append(i)
                params["counts"].append(n)
        if self.totals is not None:
            for key, pending in self.pending.items():
                total = self.totals.setdefault(key, Histogram())
                total.add(pending.counts, pending.counts.values())
                total.sum += pending.sum
        self.pending = {}
        self.written_at = now
        return params

    def histograms(self) -> dict[tuple[str, str], Histogram]:
        """Everything recorded since the start, per (kind, metric): the totals and what is pending."""
        out = {}
        for key in sorted({*(self.totals or {}), *self.pending}):
            h = Histogram()
            total = (self.totals or {}).get(key)
            if total is not None:
                h.add(total.counts, total.counts.values())
                h.sum = total.sum
            pending = self.pending.get(key)
            if pending is not None:
                h.add(pending.counts, pending.counts.values())
                h.sum += pending.sum
            out[key] = h
        return out

    def due_in(self, now: float) -> float | None:
        """Seconds until pending figures are due, or None when nothing is pending."""
        if not self.pending:
            return None
        return max(0.0, self.written_at + WRITE_EVERY - now)


# --- reading ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """One metric of one kind over one window: how many jobs and their percentiles (seconds)."""

    count: int
    p50: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, histogram: Histogram) -> Figures:
        p50, p95, p99 = (histogram.percentile(q) for q in PERCENTILES)
        return cls(histogram.total, p50, p95, p99)


@dataclass(frozen=True)
class KindLatency:
    kind: str
    # metric -> window (minutes) -> figures
    figures: dict[str, dict[int, Figures]]
    rising: bool  # queue latency's p95 of the last minute well above that of the five before

    def get(self, metric: str, window: int) -> Figures:
        return self.figures[metric][window]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "rising": self.rising,
            **{metric: {f"{w}m": vars(f) for w, f in windows.items()} for metric, windows in self.figures.items()},
        }


def rising(now: Histogram, before: Histogram) -> bool:
    """Whether latency is rising: the p95 of `now` over the p95 of `before` by RISING_FACTOR and
    RISING_MARGIN. Without figures from before there is nothing to rise from.

    >>> a, b = Histogram(), Histogram()
    >>> for _ in range(10): a.observe(0.002); b.observe(0.9)
    >>> rising(b, a), rising(a, b), rising(b, Histogram())
    (True, False, False)
    """
    p_now, p_before = now.percentile(0.95), before.percentile(0.95)
    if p_now is None or p_before is None:
        return False
    return p_now > p_before * RISING_FACTOR + RISING_MARGIN


# The windows (and "before", what rising compares with) each part of latency_read counts in.
_PARTS = {1: (1, 5), 5: (5, "before"), 6: ("before",), 60: (60,)}


def summarize(rows: Iterable[Mapping[str, Any]]) -> list[KindLatency]:
    """Per kind figures from the rows of `latency_read` (one per kind, metric, bucket and part)."""
    hists: dict[str, dict[str, dict[Any, Histogram]]] = {}
    for row in rows:
        windows = hists.setdefault(row["kind"], {m: {} for m in METRICS}).setdefault(row["metric"], {})
        for key in _PARTS[row["part"]]:
            windows.setdefault(key, Histogram()).add([row["bucket"]], [row["count"]])
    out = []
    for kind in sorted(hists):
        by_metric = hists[kind]
        figures = {
            metric: {w: Figures.of(by_metric.get(metric, {}).get(w, Histogram())) for w in WINDOWS}
            for metric in METRICS
        }
        latency = by_metric.get("queue_latency", {})
        out.append(KindLatency(kind, figures, rising(latency.get(1, Histogram()), latency.get("before", Histogram()))))
    return out


def read(conn: psycopg.Connection) -> list[KindLatency]:
    """Queue latency and run time per kind over each of WINDOWS (window_label), merged across supervisors."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(SQL["latency_read"])
        return summarize(cur.fetchall())


async def aread(conn: psycopg.AsyncConnection) -> list[KindLatency]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(SQL["latency_read"])
        return summarize(await cur.fetchall())
