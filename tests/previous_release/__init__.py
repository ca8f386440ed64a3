"""The statements of earlier releases, for the upgrade tests, taken from git history by

    python -m tests.previous_release        # rewrite every file here from its commit

and never edited by hand (tests/test_upgrade.py checks each file against its commit when this clone
holds the history).

A release is the commit before a migration, or a version of the CHANGELOG: a supervisor or an enqueuer
of that commit goes on running while the schema is upgraded under it. Its file holds, of the statements
it runs on every job (NAMES), those that differ from the release's before it; `statements()` puts them
together. lifecycle.sql (schema 7) and lifecycle_v8.sql (schema 8) are whole copies of a commit's
jobsup/db/queries/lifecycle.sql, for tests/test_limits.py and tests/test_workflows_upgrade.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from jobsup.db.sql import load

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
REGENERATE = "python -m tests.previous_release"

# The statements a supervisor and an enqueuer run on a job, in the order of its life.
NAMES = ["enqueue", "claim", "claim_limited", "complete", "fail", "reap"]


@dataclass(frozen=True)
class Release:
    name: str  # its file, tests/previous_release/{name}.sql
    commit: str
    schema: int  # the schema version it ran on
    what: str

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.sql"


# In the order they were made: each file holds what changed since the one above it.
RELEASES = [
    Release("v0_1_0", "6d7a56ca21b005eebfb86df8366ab6a7f65ee2d6", 6, "0.1.0, the first version (no tag marks it)"),
    Release("before_0008", "7986b742026ddbabda673910f92eb29219db99d8", 7, "the commit before migration 0008 (limits)"),
    Release(
        "before_0009", "0d1f1c011b2e314a4230cd730e7bca3dcf1650d8", 8, "the commit before migration 0009 (workflows)"
    ),
    Release("before_0010", "f3ab500c523c3e221b26ea123f203260ae29368c", 9, "the commit before migration 0010 (meta)"),
    Release(
        "before_0011",
        "d386654f3dcfd1e478ee7687e92d33394646999e",
        10,
        "the commit before migration 0011 (claim protocol)",
    ),
    Release(
        "before_0012", "8fe15ee4b49b2d78d2ffa61b80e6c54c28ebaba2", 11, "the commit before migration 0012 (limited meta)"
    ),
    Release("before_0013", "118221e3f81f7a7512194c41e45a6f59265641ca", 12, "the commit before migration 0013 (audit)"),
]


@dataclass(frozen=True)
class Copy:
    """A whole query file of a commit, kept as it was, under a header of its own."""

    name: str
    commit: str
    header: str

    @property
    def path(self) -> Path:
        return HERE / f"{self.name}.sql"


COPIES = [
    Copy(
        "lifecycle",
        "7986b742026ddbabda673910f92eb29219db99d8",
        "-- The supervisor statements of the release before limits (schema version 7), as it shipped them: the\n"
        "-- upgrade tests run them against the migrated schema (tests/test_limits.py). Never edited.\n",
    ),
    Copy(
        "lifecycle_v8",
        "0d1f1c011b2e314a4230cd730e7bca3dcf1650d8",
        "-- The supervisor statements of the release before workflows (schema version 8), as it shipped them:\n"
        "-- the upgrade tests run them against the migrated schema (tests/test_workflows_upgrade.py). Never edited.\n",
    ),
]

# Where a commit kept its statements: one file before the package's layout by use, one per domain after.
_QUERIES = re.compile(r"^jobsup/(queries\.sql|db/queries/\w+\.sql)$")
# A statement's leading comments (why it is written so): today's files say that; left out to keep these small.
_LEADING_COMMENTS = re.compile(r"\A(\s*--[^\n]*\n)+")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def has_history(commit: str) -> bool:
    """Whether this clone holds `commit` (a shallow clone does not)."""
    found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    return found.returncode == 0


def _of_commit(commit: str) -> dict[str, str]:
    """NAMES as the commit's query files held them (those it had)."""
    statements: dict[str, str] = {}
    for path in sorted(_git("ls-tree", "-r", "--name-only", commit, "jobsup").split()):
        if _QUERIES.match(path):
            statements.update(load(_git("show", f"{commit}:{path}")))
    return {name: _LEADING_COMMENTS.sub("", statements[name]) for name in NAMES if name in statements}


def statements(release: Release) -> dict[str, str]:
    """The release's statements: its file over those of the releases before it."""
    together: dict[str, str] = {}
    for earlier in RELEASES[: RELEASES.index(release) + 1]:
        together.update(load(earlier.path.read_text()))
    return together


def text_of(release: Release) -> str:
    """The release's file, made from its commit and the commit of the release before it."""
    index = RELEASES.index(release)
    before = _of_commit(RELEASES[index - 1].commit) if index else {}
    now = _of_commit(release.commit)
    gone = sorted(before.keys() - now.keys())
    if gone:  # a file cannot say a statement is gone; these tests would run it still
        raise RuntimeError(f"{release.name} lacks {', '.join(gone)}, which the release before it ran")
    changed = {name: sql for name, sql in now.items() if before.get(name) != sql}
    since = f"since {RELEASES[index - 1].name}.sql, the rest as there" if index else "all of them"
    header = (
        f"-- The statements of {release.what}: commit {release.commit[:12]}, schema version {release.schema}.\n"
        f"-- Those that changed {since} (their leading comments left out).\n"
        f"-- Generated by `{REGENERATE}`; never edited. tests/test_upgrade.py runs them.\n"
    )
    if not changed:
        header += "-- None changed.\n"
    return header + "".join(f"\n-- name: {name}\n{sql}\n" for name, sql in changed.items())


def copy_of(copy: Copy) -> str:
    return copy.header + "\n" + _git("show", f"{copy.commit}:jobsup/db/queries/lifecycle.sql")


def main(argv: list[str]) -> int:
    if argv:
        print(f"usage: {REGENERATE}", file=sys.stderr)
        return 2
    for release in RELEASES:
        release.path.write_text(text_of(release))
        print(f"wrote {release.path.relative_to(ROOT)}")
    for copy in COPIES:
        copy.path.write_text(copy_of(copy))
        print(f"wrote {copy.path.relative_to(ROOT)}")
    return 0
