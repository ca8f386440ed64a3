"""Login attempts throttled: after a few failures from one address, or for one user name, further
attempts are refused for a while, so a password cannot be guessed at the speed of the network."""

from __future__ import annotations

import time
from collections import defaultdict, deque

FAILURES = 5  # failed attempts within WINDOW ...
WINDOW = 300.0  # seconds ...
# ... after which that address or that name is refused until its oldest failure leaves the window.


class Throttle:
    """
    >>> t = Throttle(failures=2, window=10.0)
    >>> t.failed("ip", "ann", now=0.0); t.failed("ip", "bob", now=1.0)
    >>> t.wait("ip", "carl", now=2.0), t.wait("other", "carl", now=2.0), t.wait("ip", "carl", now=11.0)
    (8.0, 0.0, 0.0)
    """

    def __init__(self, failures: int = FAILURES, window: float = WINDOW) -> None:
        self.failures = failures
        self.window = window
        self._seen: defaultdict[str, deque[float]] = defaultdict(deque)

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._seen[key]
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._seen[key]  # the map holds only keys with recent failures
            return deque()
        return times

    def wait(self, address: str, name: str, *, now: float | None = None) -> float:
        """Seconds before an attempt from `address` for `name` is heard; 0 when it may be tried now."""
        now = time.monotonic() if now is None else now
        waits = [0.0]
        for key in (f"a:{address}", f"u:{name}"):
            times = self._recent(key, now)
            if len(times) >= self.failures:
                waits.append(times[0] + self.window - now)
        return max(waits)

    def failed(self, address: str, name: str, *, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for key in (f"a:{address}", f"u:{name}"):
            self._seen[key].append(now)
