"""The named statements of queries.sql, loaded once."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load(text: str) -> dict[str, str]:
    """Statements of a file where each begins with a `-- name: NAME` line.

    >>> load("-- name: a\\nSELECT 1\\n\\n-- name: b\\n-- why\\nSELECT 2\\n")
    {'a': 'SELECT 1', 'b': '-- why\\nSELECT 2'}
    """
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2])}


STATEMENTS: dict[str, str] = load(resources.files("jobsup").joinpath("queries.sql").read_text())
