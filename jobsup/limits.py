"""Limits: at most N jobs of a kind (or of one key of a kind) held at once, at most R started per period.

What a handler declares (`@app.handler("charge", concurrency=3, rate="100/m", key_concurrency=1)`) and
what `jobsup limit` sets, checked and written the same way. The database holds them and the claim obeys
them (jobsup.claim_limited, migration 0008); this module only reads and checks what people write.

A rate spaces starts evenly: "100/m" allows one start every 0.6 s, and `burst` of them at once after a
quiet spell (GCRA, the generic cell rate algorithm: no window edge lets twice the rate through).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobsup.errors import BadInput

# Seconds in each unit a rate may be given per: "100/s", "100/second", "6000/10m".
_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")
_INT_MAX = 2**31 - 1
# Longest key: a key names an account or a customer, and is stored on every job and in the console.
MAX_KEY_LENGTH = 200


@dataclass(frozen=True)
class Rate:
    """At most `count` starts per `period` seconds, `burst` at once.

    >>> Rate.parse("100/m")
    Rate(count=100, period=60.0, burst=1)
    >>> Rate.parse("5/2s", burst=5).interval
    0.4
    >>> str(Rate.parse("6000/10 minutes"))
    '6000/10m'
    """

    count: int
    period: float
    burst: int = 1

    @property
    def interval(self) -> float:
        """Seconds between starts at the steady rate."""
        return self.period / self.count

    @classmethod
    def parse(cls, text: Any, burst: Any = None, what: str = "rate") -> Rate:
        """A rate from "N/unit" or "N/<number><unit>" (units s, m, h, d, or their names), or BadInput
        naming `what`."""
        if isinstance(text, Rate):
            return text if burst is None else cls(text.count, text.period, whole(burst, f"burst of {what}"))
        match = _RATE.match(text.lower()) if isinstance(text, str) else None
        name = match.group(3) if match else ""
        unit = _UNITS.get(name) or (_UNITS.get(name[:-1]) if len(name) > 3 and name.endswith("s") else None)
        if match is None or unit is None:
            raise BadInput(
                f"{what} must be a number of starts per period, such as 100/s, 50/m or 1000/h (units s, m, h, "
                f"d), not {text!r}"
            )
        count, per = int(match.group(1)), float(match.group(2) or 1)
        if not 1 <= count <= _INT_MAX or per <= 0:
            raise BadInput(f"{what} {text!r} allows no start: give at least 1 per a period longer than 0")
        return cls(count, per * unit, 1 if burst is None else whole(burst, f"burst of {what}"))

    def __str__(self) -> str:
        for name, seconds in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            per = self.period / seconds
            if per >= 1 and math.isclose(per, round(per)):
                return f"{self.count}/{'' if round(per) == 1 else round(per)}{name}"
        return f"{self.count}/{self.period:g}s"


def whole(value: Any, what: str) -> int:
    """A whole number from 1 up, or BadInput naming `what`.

    >>> whole("3", "concurrency")
    3
    >>> whole(1.5, "concurrency")
    Traceback (most recent call last):
    ...
    jobsup.errors.BadInput: concurrency must be a whole number from 1 up, not 1.5
    """
    number: Any = value
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= _INT_MAX:
        raise BadInput(f"{what} must be a whole number from 1 up, not {value!r}")
    return number


@dataclass(frozen=True)
class Limits:
    """A kind's limits; None is no such limit."""

    concurrency: int | None = None
    rate: Rate | None = None
    key_concurrency: int | None = None
    key_rate: Rate | None = None

    @classmethod
    def of(
        cls,
        kind: str,
        *,
        concurrency: Any = None,
        rate: Any = None,
        burst: Any = None,
        key_concurrency: Any = None,
        key_rate: Any = None,
        key_burst: Any = None,
    ) -> Limits:
        """Limits from what a person wrote (numbers, or strings of them; rates as "100/s"), or BadInput
        naming the kind and the value."""
        if burst is not None and rate is None:
            raise BadInput(f"kind {kind!r}: a burst needs a rate")
        if key_burst is not None and key_rate is None:
            raise BadInput(f"kind {kind!r}: a key_burst needs a key_rate")
        return cls(
            concurrency=None if concurrency is None else whole(concurrency, f"concurrency of kind {kind!r}"),
            rate=None if rate is None else Rate.parse(rate, burst, f"rate of kind {kind!r}"),
            key_concurrency=(
                None if key_concurrency is None else whole(key_concurrency, f"key_concurrency of kind {kind!r}")
            ),
            key_rate=None if key_rate is None else Rate.parse(key_rate, key_burst, f"key_rate of kind {kind!r}"),
        )

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.concurrency, self.rate, self.key_concurrency, self.key_rate))

    def columns(self) -> dict[str, Any]:
        """The values of jobsup.limits' columns."""
        rate, key_rate = self.rate, self.key_rate
        return {
            "concurrency": self.concurrency,
            "rate": rate and rate.count,
            "period": rate and rate.period,
            "burst": rate and rate.burst,
            "key_concurrency": self.key_concurrency,
            "key_rate": key_rate and key_rate.count,
            "key_period": key_rate and key_rate.period,
            "key_burst": key_rate and key_rate.burst,
        }

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> Limits:
        def rate(prefix: str) -> Rate | None:
            count = row.get(f"{prefix}rate")
            return None if count is None else Rate(count, row[f"{prefix}period"], row[f"{prefix}burst"])

        return cls(row.get("concurrency"), rate(""), row.get("key_concurrency"), rate("key_"))

    def to_json(self) -> dict[str, Any]:
        """What the database's `declared` and `jobsup limit --json` hold: rates as "N/unit" text."""
        out: dict[str, Any] = {}
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        if self.rate is not None:
            out["rate"], out["burst"] = str(self.rate), self.rate.burst
        if self.key_concurrency is not None:
            out["key_concurrency"] = self.key_concurrency
        if self.key_rate is not None:
            out["key_rate"], out["key_burst"] = str(self.key_rate), self.key_rate.burst
        return out

    @classmethod
    def from_json(cls, kind: str, data: Mapping[str, Any] | None) -> Limits:
        return cls.of(kind, **(data or {}))

    def __str__(self) -> str:
        """
        >>> str(Limits(3, Rate(100, 60.0, 1), 1, None))
        'concurrency 3, rate 100/m, key_concurrency 1'
        >>> str(Limits())
        'none'
        """
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate {self.rate}" + (f" (burst {self.rate.burst})" if self.rate.burst > 1 else ""))
        if self.key_concurrency is not None:
            parts.append(f"key_concurrency {self.key_concurrency}")
        if self.key_rate is not None:
            parts.append(
                f"key_rate {self.key_rate}" + (f" (burst {self.key_rate.burst})" if self.key_rate.burst > 1 else "")
            )
        return ", ".join(parts) or "none"


def check_key(key: Any, kind: str) -> str:
    """A job's key as given, or BadInput: a non-empty string of at most MAX_KEY_LENGTH characters."""
    if not isinstance(key, str) or not key:
        raise BadInput(f"key of a {kind!r} job must be a non-empty string, not {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise BadInput(f"key of a {kind!r} job is {len(key)} characters, over the limit of {MAX_KEY_LENGTH}")
    return key
