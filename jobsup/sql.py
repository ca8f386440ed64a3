"""The named statements of queries.sql, loaded once."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# Comment lines after a statement's last line of SQL: the header of the next section, not this
# statement's. Left on, a placeholder named in such a header would be a parameter of this statement.
_TRAILING_COMMENTS = re.compile(r"(\n\s*(--[^\n]*)?)+\Z")


def load(text: str) -> dict[str, str]:
    """Statements of a file where each begins with a `-- name: NAME` line.

    >>> load("-- name: a\\nSELECT 1\\n\\n-- section\\n-- %(x)s is...\\n-- name: b\\n-- why\\nSELECT 2\\n")
    {'a': 'SELECT 1', 'b': '-- why\\nSELECT 2'}
    """
    parts = _NAME.split(text)
    return {name: _TRAILING_COMMENTS.sub("", body.strip()) for name, body in zip(parts[1::2], parts[2::2])}


STATEMENTS: dict[str, str] = load(resources.files("jobsup").joinpath("queries.sql").read_text())
