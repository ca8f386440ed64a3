"""Decoding the insert notification, the one the listener hears by the thousand: `jobsup.db.notify`'s
decode (and its routing by type, as the listener does it) against the path it replaced (the
dispatcher's four substring tests, the scheduler's one, then json.loads and the dict's lookups).

    .venv/bin/python -m benchmarks.bench_notify [--rounds 25]

Each round times each path over 100,000 payloads, in turn; printed: the best and the median round, in
nanoseconds a payload. No database: the payload is the text the insert trigger sends.

On the project's machine (load average 3.4, 40 rounds), medians: substring tests + json.loads 2,470 ns,
notify.decode 1,719 ns, decode + match 1,899 ns.
"""

from __future__ import annotations

import argparse
import json
import timeit

from jobsup.db import notify

PAYLOAD = '{"queues" : ["default"], "run_at" : 1733370000.123456}'
# The words the dispatcher looked for before the typed messages: an insert's payload has none.
_CONTROL_WORDS = ('"cancel"', '"paused"', '"limit"', '"slots"')
PER_ROUND = 100_000


def substring_tests(payload: str) -> tuple | None:
    """What the listener did before: Dispatcher.control's test, Scheduler.notified's, and the parse of
    Dispatcher.notified."""
    if any(word in payload for word in _CONTROL_WORDS):
        return None
    if '"schedule"' in payload:
        return None
    try:
        note = json.loads(payload) if payload else {}
    except ValueError:
        note = {}
    run_at = note.get("run_at")
    return note.get("queues") or [], run_at if isinstance(run_at, (int, float)) else None


def decode_and_route(payload: str) -> tuple | None:
    """What the listener does now: decode, match on the type, and Dispatcher.notified's unpacking."""
    match message := notify.decode(payload):
        case notify.JobsQueued():
            queues, run_at = message
            return queues, run_at
        case notify.SchedulePaused() | notify.Unknown():
            return None
        case _:
            return None


PATHS = {
    "substring tests + json.loads": substring_tests,
    "notify.decode": notify.decode,
    "decode + match": decode_and_route,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=25)
    args = parser.parse_args()
    assert substring_tests(PAYLOAD) == (["default"], 1733370000.123456)
    assert decode_and_route(PAYLOAD) == (("default",), 1733370000.123456)
    times: dict[str, list[float]] = {name: [] for name in PATHS}
    for _ in range(args.rounds):
        for name, path in PATHS.items():
            times[name].append(timeit.timeit(lambda path=path: path(PAYLOAD), number=PER_ROUND) / PER_ROUND)
    for name, each in times.items():
        each.sort()
        print(f"{name:30s} best {each[0] * 1e9:6.0f} ns   median {each[len(each) // 2] * 1e9:6.0f} ns")


if __name__ == "__main__":
    main()
