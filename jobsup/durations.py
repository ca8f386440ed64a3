"""Durations on the command line and in the environment: `0.4` (seconds), `400ms`, `30s`, `5m`, `1h`."""

from __future__ import annotations

import re

from .errors import BadInput

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")


def parse_duration(text: str | float | int) -> float:
    """Seconds in `text`.

    >>> parse_duration("400ms"), parse_duration("0.4"), parse_duration("5m"), parse_duration(2)
    (0.4, 0.4, 300.0, 2.0)
    """
    if isinstance(text, (int, float)):
        if text < 0:
            raise BadInput(f"a duration cannot be negative: {text}")
        return float(text)
    match = _PATTERN.match(text)
    if not match:
        raise BadInput(f"not a duration: {text!r} (use seconds like 0.4, or 400ms, 30s, 5m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def format_duration(seconds: float | None) -> str:
    """A short human reading of `seconds`.

    >>> format_duration(0.0042), format_duration(3.2), format_duration(95), format_duration(7300), format_duration(None)
    ('4ms', '3.2s', '1m35s', '2h01m', '-')
    """
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
