"""A flag an asyncio loop can wait on with a timeout, without a task per wait: how the claim loop, the
lease renewer, the scheduler and the shutdown are woken."""

from __future__ import annotations

import asyncio


class Wakeup:
    """A flag the loop can wait on with a timeout, without a task per wait."""

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._flag = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """True if set (now or before), False after `timeout` seconds."""
        if not self._flag:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            handle = loop.call_later(max(0.0, timeout), _wake, waiter)
            try:
                await waiter
            finally:
                handle.cancel()
                self._waiter = None
        woke, self._flag = self._flag, False
        return woke


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # set() may have woken it within the same loop iteration
        waiter.set_result(None)
