"""Where the console draws: on the terminal itself (/dev/tty), never on stderr.

Textual's Linux driver writes the screen to stderr, so `jobsup top 2>file` would draw into the file and
leave the terminal blank, and `jobsup top 2>&1 | tee log` would fill the log with escape codes. The
console is a terminal program: it draws on its controlling terminal whatever its standard files are,
as less and htop do, and reads the terminal's size there too. With no controlling terminal (a service,
a test's headless driver) nothing changes.
"""

from __future__ import annotations

import os
from typing import IO, Any

from textual.driver import Driver


def terminal_driver(base: type[Driver]) -> type[Driver]:
    """`base`, drawing on /dev/tty when it is Textual's Linux driver; any other driver as it is."""
    try:
        from textual.drivers.linux_driver import LinuxDriver
    except ImportError:  # Windows: its driver writes to the console already
        return base
    if not issubclass(base, LinuxDriver):
        return base  # headless (tests), web, or a driver named by TEXTUAL_DRIVER

    class TerminalDriver(base):  # type: ignore[valid-type,misc]  # a class chosen at run time
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._tty: IO[str] | None = None
            try:
                self._tty = open("/dev/tty", "w", encoding="utf-8")  # closed in close()
            except OSError:
                return  # no controlling terminal: stderr is all there is
            self._file = self._tty

        def _get_terminal_size(self) -> tuple[int, int]:
            if self._tty is not None:
                try:
                    columns, lines = os.get_terminal_size(self._tty.fileno())
                    return columns, lines
                except OSError:
                    pass
            return super()._get_terminal_size()

        def close(self) -> None:
            super().close()  # stops the writer thread, which writes to the terminal until then
            if self._tty is not None:
                self._tty.close()
                self._tty = None

    return TerminalDriver
