"""A real process on a pseudo-terminal that is its controlling terminal, as a shell gives it: for the
tests that run `jobsup top` or `make demo` as a person would, and press keys."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from typing import IO

from .helpers import ROOT


class Terminal:
    def __init__(
        self, args: list[str], env: dict[str, str], size: tuple[int, int] = (80, 24), stderr: IO | None = None
    ) -> None:
        self.master, slave = pty.openpty()
        columns, lines = size
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))

        def own_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            args,
            stdin=slave,
            stdout=slave,
            stderr=slave if stderr is None else stderr,
            cwd=ROOT,
            env=env,
            preexec_fn=own_terminal,
        )
        os.close(slave)
        self.seen = b""

    def read(self, timeout: float = 0.2) -> None:
        """What it wrote meanwhile; reading on keeps a console that draws from blocking on a full pty."""
        if select.select([self.master], [], [], timeout)[0]:
            try:
                self.seen += os.read(self.master, 65536)
            except OSError:  # it closed the terminal
                pass

    def wait_for(self, text: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen and time.monotonic() < deadline and self.proc.poll() is None:
            self.read()
        assert text in self.seen, self.seen[-2000:]

    def quit(self, key: bytes, timeout: float) -> int:
        """Press `key` and read on while the process ends (what it draws last, and the terminal's
        restore, can fill the pty's buffer, and a console blocked writing to it never exits)."""
        os.write(self.master, key)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read()
        self.read(0.5)
        return self.proc.wait(timeout=5)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
