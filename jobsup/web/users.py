"""The users of the standalone login: a name, a role and a password hash each, from the environment
(JOBSUP_WEB_USERS) or a file (JOBSUP_WEB_USERS_FILE, --users-file) that `jobsup web --add-user` writes.

One user a line, `name:role:hash` (in the variable, lines or `;` between users). No plain password is
ever stored: `jobsup web --hash-password` prints a hash for the variable."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jobsup.errors import BadInput
from jobsup.web.passwords import check_hash

VIEWER, OPERATOR = "viewer", "operator"
ROLES = (VIEWER, OPERATOR)


@dataclass(frozen=True)
class User:
    name: str
    role: str
    hash: str


def check_role(role: str) -> str:
    if role not in ROLES:
        raise BadInput(f"a role is {' or '.join(ROLES)}, not {role!r}")
    return role


def check_name(name: str) -> str:
    if not name or name != name.strip() or ":" in name or any(c.isspace() for c in name) or len(name) > 100:
        raise BadInput(f"a user name is up to 100 characters without spaces or ':', not {name!r}")
    return name


def parse(text: str, where: str) -> dict[str, User]:
    """Users from `name:role:hash` lines (or `;`-separated); BadInput naming `where` and the line.

    >>> from jobsup.web.passwords import hash_password
    >>> h = hash_password("pw")
    >>> sorted(parse(f"ann:operator:{h}; bob:viewer:{h}", "env")), parse("x:admin:" + h, "env")
    Traceback (most recent call last):
    jobsup.errors.BadInput: env, line 1: a role is viewer or operator, not 'admin'
    """
    users: dict[str, User] = {}
    lines = [line.strip() for part in text.splitlines() for line in part.split(";")]
    for number, line in enumerate(lines, 1):
        if not line or line.startswith("#"):
            continue
        try:
            name, role, hashed = line.split(":", 2)
            users[check_name(name)] = User(name, check_role(role), check_hash(hashed))
        except ValueError:
            raise BadInput(f"{where}, line {number}: not name:role:hash") from None
        except BadInput as exc:
            raise BadInput(f"{where}, line {number}: {exc}") from None
    return users


def load(path: str | None) -> dict[str, User]:
    """The users of JOBSUP_WEB_USERS and of the file `path` (its users win); empty when neither is given."""
    users = parse(os.environ.get("JOBSUP_WEB_USERS", ""), "JOBSUP_WEB_USERS")
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise BadInput(f"cannot read the users file {path}: {exc.strerror}") from None
        users.update(parse(text, path))
    return users


def add(path: str, user: User) -> bool:
    """Write `user` into the file (made with mode 0600 if missing), replacing a user of that name;
    whether it replaced one."""
    file = Path(path)
    lines = file.read_text().splitlines() if file.exists() else []
    kept = [line for line in lines if line.split(":", 1)[0].strip() != user.name]
    kept.append(f"{user.name}:{user.role}:{user.hash}")
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(kept) + "\n")
    return len(kept) == len(lines)
