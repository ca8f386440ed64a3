"""Durations on the command line and in the environment: `0.4` (seconds), `400ms`, `30s`, `5m`, `1h`, `7d`."""

from __future__ import annotations

import re

from jobsup.errors import BadInput

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The sign is read too, so that "-5" is told it must be 0 or more rather than that it is no duration.
_PATTERN = re.compile(r"^\s*(-?)\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str | float | int) -> float:
    """Seconds in `text`.

    >>> [parse_duration(t) for t in ("400ms", "0.4", "5m", "7d", 2)]
    [0.4, 0.4, 300.0, 604800.0, 2.0]
    >>> parse_duration("-5m")
    Traceback (most recent call last):
    jobsup.errors.BadInput: a duration must be 0 or more, not '-5m'
    """
    if isinstance(text, (int, float)):
        if text < 0:
            raise BadInput(f"a duration must be 0 or more, not {text}")
        return float(text)
    match = _PATTERN.match(text)
    if not match:
        raise BadInput(f"not a duration: {text!r} (use seconds like 0.4, or 400ms, 30s, 5m, 1h, 7d)")
    sign, number, unit = match.groups()
    seconds = float(number) * _UNITS[unit or "s"]
    if sign and seconds:
        raise BadInput(f"a duration must be 0 or more, not {text.strip()!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """A duration as a flag would take it, in the largest unit that says it exactly.

    >>> [format_duration(s) for s in (0.002, 0.5, 30.0, 90.0, 86400.0, 7 * 86400.0)]
    ['2ms', '500ms', '30s', '90s', '24h', '7d']
    """
    if seconds > 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g}d"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def format_age(seconds: float | None) -> str:
    """A compact age or duration, as `jobsup stats` and the console show them.

    >>> [format_age(s) for s in (None, 0.2, 4.25, 59.9, 61, 3599, 3600 * 5 + 60 * 7, 86400 * 3 + 3600 * 2)]
    ['-', '0.2s', '4.2s', '59.9s', '1m01s', '59m59s', '5h07m', '3d02h']
    """
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{int(seconds * 10) / 10:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600):02d}h"


def format_seconds(seconds: float | None) -> str:
    """A percentile as the tables show it.

    >>> [format_seconds(s) for s in (None, 0.0123, 0.25, 4.2, 75.0)]
    ['-', '12.3ms', '250ms', '4.20s', '1m15s']
    """
    if seconds is None:
        return "-"
    if seconds < 0.1:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.2f}s"
    return format_age(seconds)
