"""One log line per lifecycle event, with the same fields everywhere: action first, then job, kind,
attempt, pid and the rest. Text for a terminal, or one JSON object per line (`--log-format json`)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_ORDER = ("job", "kind", "attempt", "pid", "slot")


class EventLog:
    def __init__(self, fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
        self.fmt = fmt
        self.threshold = _LEVELS[level]
        self.stream = stream or sys.stderr

    def __call__(self, action: str, level: str = "info", **fields: Any) -> None:
        if _LEVELS[level] < self.threshold:
            return
        now = time.time()
        if self.fmt == "json":
            record = {"ts": round(now, 3), "level": level, "action": action, **fields}
            line = json.dumps(record, default=str, separators=(",", ":"))
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
            keys = [k for k in _ORDER if k in fields] + [k for k in fields if k not in _ORDER]
            parts = [f"{k}={_text(fields[k])}" for k in keys if fields[k] is not None]
            marker = "" if level == "info" else f"{level.upper()} "
            line = f"{stamp} {marker}{action:<18} {' '.join(parts)}".rstrip()
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal must not stop the supervisor
            pass


def _text(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return repr(text) if (" " in text or not text) else text
