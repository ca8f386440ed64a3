"""Messages between the supervisor and a worker: pickled tuples, each behind a 4-byte length.

multiprocessing.Connection costs two reads and a poll (a new selector each time) per message; at
thousands of jobs a second that was half the supervisor's time. Here a readable pipe is read once and
every whole message in it is taken.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
from typing import Any

_HEADER = struct.Struct("!I")
_READ_SIZE = 1 << 18


def send(fd: int, message: tuple[Any, ...]) -> None:
    """Write one message (blocking until the whole of it is written)."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view) :]


class Reader:
    """Whole messages out of the bytes read so far."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.pending: list[tuple[Any, ...]] = []  # messages read and given back (push_back), first out first

    def push_back(self, messages: list[tuple[Any, ...]]) -> None:
        """Give back messages taken but not handled: read_one returns them first, in order."""
        self.pending[:0] = messages

    def take_buffered(self) -> list[tuple[Any, ...]]:
        """The whole messages read already (given back, or in the buffer), without reading."""
        messages, self.pending = self.pending, []
        return messages + self._messages()

    def read_available(self) -> list[tuple[Any, ...]] | None:
        """One read (call when the fd is readable); the whole messages it completed, or None at EOF."""
        data = os.read(self.fd, _READ_SIZE)
        if not data:
            return None
        self.buffer += data
        return self._messages()

    def read_one(self) -> tuple[Any, ...] | None:
        """Block until one whole message is here; None at EOF."""
        if self.pending:
            return self.pending.pop(0)
        while True:
            messages = self._messages(limit=1)
            if messages:
                return messages[0]
            data = os.read(self.fd, _READ_SIZE)
            if not data:
                return None
            self.buffer += data

    def read_ready(self) -> list[tuple[Any, ...]]:
        """The whole messages here now, without waiting: a worker's SIGTERM handler reads the reason its
        keeper sent before the signal (at most one read, as a blocking read there would hang it)."""
        if select.select([self.fd], [], [], 0)[0]:
            data = os.read(self.fd, _READ_SIZE)
            self.buffer += data
        return self._messages()

    def _messages(self, limit: int | None = None) -> list[tuple[Any, ...]]:
        messages: list[tuple[Any, ...]] = []
        offset = 0
        buffer = self.buffer
        while len(buffer) - offset >= _HEADER.size and (limit is None or len(messages) < limit):
            (size,) = _HEADER.unpack_from(buffer, offset)
            end = offset + _HEADER.size + size
            if len(buffer) < end:
                break
            messages.append(pickle.loads(buffer[offset + _HEADER.size : end]))
            offset = end
        if offset:
            del buffer[:offset]
        return messages
