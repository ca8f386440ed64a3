"""The one protocol of the supervisor's background work, and the maintainer that runs it.

A duty has a name and one coroutine, `run`, which does its work until it is cancelled (or returns when
it has none: an app without schedules). The supervisor lists its duties once, in the order they start;
`Duties` starts each as a task named after it and stops them in the order the shutdown asks. A new
duty adds a module and a line in that list; the supervisor's loop and shutdown do not grow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Protocol


class Duty(Protocol):
    @property
    def name(self) -> str:
        """The name of its task: what the log and /healthz call it when it fails."""
        ...

    async def run(self) -> None: ...


@dataclass(frozen=True)
class Loop:
    """A loop that belongs to another object (the claimer's, the outcome writer's and the lease renewer's,
    the keeper's clock) run as a duty, so the supervisor starts, watches and stops every loop the same way."""

    name: str
    run: Callable[[], Coroutine[Any, Any, None]]


class Duties:
    """The maintainer: starts every duty as a task, says which one failed, stops them in order."""

    def __init__(self, duties: Iterable[Duty] = ()) -> None:
        self._duties = list(duties)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, on_end: Callable[[], None]) -> None:
        """Start every duty in the listed order; `on_end` is called when any one ends, so a loop that
        died of a bug cannot leave the supervisor half-alive."""
        loop = asyncio.get_running_loop()
        for duty in self._duties:
            task = loop.create_task(duty.run(), name=duty.name)
            task.add_done_callback(lambda _: on_end())
            self._tasks[duty.name] = task

    def failed(self) -> tuple[str, BaseException] | None:
        """The first duty, in the listed order, that ended with an exception, and that exception."""
        for name, task in self._tasks.items():
            if task.done() and not task.cancelled():
                error = task.exception()
                if error is not None:
                    return name, error
        return None

    async def wait(self, name: str, timeout: float) -> None:
        """Give a duty up to `timeout` seconds to end by itself (the claim loop, once told to stop)."""
        task = self._tasks.get(name)
        if task is not None:
            await asyncio.wait([task], timeout=timeout)

    async def stop(self, names: Iterable[str] | None = None) -> None:
        """Cancel the named duties (every one without names) in the given order, then wait until all of
        them have ended. A duty not running is skipped; what a stopped duty raised is not raised here."""
        chosen = list(self._tasks) if names is None else [name for name in names if name in self._tasks]
        tasks = [self._tasks[name] for name in chosen]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
