"""How the console writes figures as text: counts, sizes, rates, ages, cut text, and the notes of the
header. Pure functions of plain values (figures.py holds the values themselves): no textual, no database.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from jobsup.durations import format_age
from jobsup.limits import Rate
from jobsup.ops.unserved import Unserved

if TYPE_CHECKING:
    from jobsup.monitor.figures import Supervisor

age = format_age  # the console's name for it: the panels show ages as fmt.age(seconds)
# Starts are counted within a rate's period up to this many seconds: longer periods over their last
# minute, which a refresh reads anyway for done/min (console_limit_keys).
STARTS_SPAN = 60.0


def unserved_note(items: Sequence[Unserved], most: int = 3) -> str:
    """The header's line about them.

    >>> note = unserved_note([Unserved("mix", "c", 5, 75.0), Unserved("x", "d", 1, 2.0)])
    >>> note
    'unserved: kind c in queue mix, 5 ready, oldest 1m15s; kind d in queue x, 1 ready, oldest 2.0s'
    >>> unserved_note([Unserved("q", k, 1, 1.0) for k in "abcde"], most=2)
    'unserved: kind a in queue q, 1 ready, oldest 1.0s; kind b in queue q, 1 ready, oldest 1.0s; +3 more'
    >>> unserved_note([])
    ''
    """
    if not items:
        return ""
    shown = [f"kind {u.kind} in queue {u.queue}, {u.ready:,} ready, oldest {age(u.age)}" for u in items[:most]]
    more = [f"+{len(items) - most} more"] if len(items) > most else []
    return "unserved: " + "; ".join(shown + more)


def count(n: int | None) -> str:
    """
    >>> count(1234567), count(0), count(None)
    ('1,234,567', '0', '-')
    """
    return "-" if n is None else f"{n:,}"


def since(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else (now - moment).total_seconds()


def size(n: int | None) -> str:
    """Bytes, as top shows them.

    >>> size(None), size(512), size(48 * 1024 ** 2), size(3 * 1024 ** 3 // 2)
    ('-', '512B', '48M', '1.5G')
    """
    if n is None:
        return "-"
    if n < 1024:
        return f"{n}B"
    for unit, scale in (("K", 1024), ("M", 1024**2), ("G", 1024**3)):
        if n < scale * 1024 or unit == "G":
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 and unit != "K" else f"{value:.0f}{unit}"
    raise AssertionError("unreachable")


def lag(seconds: float | None) -> str:
    """An event loop's lag, in milliseconds below a second.

    >>> lag(0.0123), lag(None), lag(2.5)
    ('12ms', '-', '2.5s')
    """
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else f"{seconds:.1f}s"


def rate(per_second: float | None) -> str:
    """
    >>> rate(None), rate(0), rate(0.25), rate(12.345), rate(1500)
    ('-', '0/s', '0.25/s', '12.3/s', '1,500/s')
    """
    if per_second is None:
        return "-"
    if per_second == 0:
        return "0/s"
    if per_second < 1:
        return f"{per_second:.2f}/s"
    if per_second < 100:
        return f"{per_second:.1f}/s"
    return f"{per_second:,.0f}/s"


def held(n: int, limit: int | None) -> str:
    """Jobs held, of the concurrency limit if there is one.

    >>> held(3, 3), held(2, None)
    ('3 of 3', '2')
    """
    return f"{n:,}" + ("" if limit is None else f" of {limit:,}")


def starts(n: int, rate: Rate | None) -> str:
    """Jobs started within a rate's period, of the rate: over the last minute when the period is longer,
    or when there is no rate (console_limit_keys).

    >>> starts(48, Rate(50, 1.0)), starts(12, Rate(1000, 3600.0)), starts(7, None)
    ('48 of 50/s', '12 in 1m of 1000/h', '7 in 1m')
    """
    if rate is not None and rate.period <= STARTS_SPAN:
        return f"{n:,} of {rate}"
    return f"{n:,} in 1m" + ("" if rate is None else f" of {rate}")  # 1m: STARTS_SPAN


def at_rate(n: int, rate: Rate | None) -> bool:
    """Whether the starts counted reach the rate (only a period of at most STARTS_SPAN is counted whole).

    >>> at_rate(50, Rate(50, 1.0)), at_rate(12, Rate(12, 3600.0)), at_rate(3, None)
    (True, False, False)
    """
    return rate is not None and rate.period <= STARTS_SPAN and n >= rate.count


def cut(text: str, width: int) -> str:
    """`text` cut to `width` characters, the cut marked.

    >>> cut("concurrency 3, rate 50/s", 16), cut("concurrency 3", 16)
    ('concurrency 3, …', 'concurrency 3')
    """
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def short_error(error: str | None, width: int) -> str:
    """The first line of an error, cut to `width` characters.

    >>> short_error("Timeout: SMTP server did not answer\\nTraceback ...", 20)
    'Timeout: SMTP serve…'
    >>> short_error(None, 10)
    ''
    """
    if not error:
        return ""
    line = error.strip().splitlines()[0] if error.strip() else ""
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def id_list(ids: Sequence[int], width: int) -> str:
    """
    >>> id_list([1, 2, 3], 20), id_list(list(range(100, 120)), 17)
    ('1, 2, 3', '100, 101, 102 +17')
    """
    shown: list[str] = []
    for i, job_id in enumerate(ids):
        rest = len(ids) - i - 1
        candidate = ", ".join([*shown, str(job_id)])
        if len(candidate) + (len(f" +{rest}") if rest else 0) > width and shown:
            return ", ".join(shown) + f" +{len(ids) - len(shown)}"
        shown.append(str(job_id))
    return ", ".join(shown)


def matches(text: str | None, *names: str | None) -> bool:
    """Whether a filter (a part of a kind or queue name, any case) matches any of `names`.

    >>> matches(None, "email"), matches("MAIL", "email"), matches("sms", "email", "default")
    (True, True, False)
    """
    if not text:
        return True
    needle = text.lower()
    return any(name is not None and needle in name.lower() for name in names)


def stale_note(supervisors: Sequence[Supervisor], after: float) -> str:
    """How many supervisors are stale and since when (their last heartbeat), for the header.

    >>> from jobsup.monitor.figures import Supervisor
    >>> t = datetime(2026, 1, 1)
    >>> sups = [Supervisor(str(i), "h", i, "0", (), 1, t, beat, "running", 0) for i, beat in enumerate((0.5, 48, 840))]
    >>> stale_note(sups[:1], 5.0), stale_note(sups[:2], 5.0), stale_note(sups, 5.0)
    ('', '+1 stale since 48.0s', '+2 stale since 48.0s–14m00s')
    """
    ages = sorted(s.heartbeat_age for s in supervisors if s.stale(after))
    if not ages:
        return ""
    since = age(ages[0]) if len(ages) == 1 or age(ages[0]) == age(ages[-1]) else f"{age(ages[0])}–{age(ages[-1])}"
    return f"+{len(ages)} stale since {since}"


def middle_cut(text: str, width: int) -> str:
    """`text` cut to `width` characters in its middle, so both its start and its end stay readable.

    >>> middle_cut("postgresql://postgres:@/postgres?host=/tmp/jobsup-data/pg", 40)
    'postgresql://postgr…=/tmp/jobsup-data/pg'
    >>> middle_cut("abcdef", 3), middle_cut("abc", 3)
    ('a…f', 'abc')
    """
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 2
    tail = width - 1 - head
    return text[:head] + "…" + text[len(text) - tail :]


def progress(done: int, failed: int, total: int) -> float:
    """The share of a workflow's jobs that have ended (done, dead or cancelled), from 0 to 1.

    >>> progress(25, 1, 52), progress(0, 0, 0)
    (0.5, 0.0)
    """
    return (done + failed) / total if total else 0.0


def percent(share: float) -> str:
    """A share as a whole percentage, rounded down: 100% means every job has ended.

    >>> percent(0.999), percent(1.0), percent(0.5)
    ('99%', '100%', '50%')
    """
    return f"{int(share * 100)}%"
