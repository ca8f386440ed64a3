"""Signed values: the session cookie of the standalone login, and the CSRF token of every form.

Both are HMAC-SHA256 under the session secret. The secret comes from JOBSUP_WEB_SECRET, or a file
(JOBSUP_WEB_SECRET_FILE, --secret-file) made once with 32 random bytes: sessions survive a restart, and
replicas given the same secret accept each other's sessions."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path

from jobsup.errors import BadInput

SESSION_COOKIE = "jobsup_session"
CSRF_COOKIE = "jobsup_csrf"
# A login lasts this long (seconds); then the login page again.
SESSION_AGE = 12 * 3600
MIN_SECRET = 16  # bytes: a shorter secret is refused


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs and checks values with one secret.

    >>> s = Signer(b"k" * 32)
    >>> s.session_of(s.session("ann", now=100.0), now=200.0)
    'ann'
    >>> s.session_of(s.session("ann", now=100.0) + "x", now=200.0) is None
    True
    >>> s.session_of(s.session("ann", now=100.0), now=100.0 + SESSION_AGE + 1) is None
    True
    >>> s.csrf_valid("abc", s.csrf("abc")), s.csrf_valid("abd", s.csrf("abc"))
    (True, False)
    """

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET:
            raise BadInput(f"the session secret must be at least {MIN_SECRET} bytes")
        self._key = secret

    def _mac(self, purpose: str, text: str) -> str:
        return _b64(hmac.new(self._key, f"{purpose}\0{text}".encode(), hashlib.sha256).digest())

    def session(self, user: str, *, now: float | None = None) -> str:
        """The cookie value of a login of `user`."""
        body = _b64(json.dumps({"u": user, "exp": (now or time.time()) + SESSION_AGE}).encode())
        return f"{body}.{self._mac('session', body)}"

    def session_of(self, value: str, *, now: float | None = None) -> str | None:
        """The user of a session cookie, or None if it is forged, damaged or expired."""
        body, _, mac = value.partition(".")
        if not hmac.compare_digest(mac, self._mac("session", body)):
            return None
        try:
            data = json.loads(_unb64(body))
        except ValueError:
            return None
        if not isinstance(data, dict) or float(data.get("exp", 0)) < (now or time.time()):
            return None
        user = data.get("u")
        return user if isinstance(user, str) else None

    def csrf(self, cookie: str) -> str:
        """The token a form carries for the browser whose CSRF cookie is `cookie`."""
        return self._mac("csrf", cookie)

    def csrf_valid(self, cookie: str, token: str) -> bool:
        return bool(cookie) and hmac.compare_digest(token, self.csrf(cookie))


def new_cookie_value() -> str:
    return secrets.token_urlsafe(24)


def load_secret(path: str | None) -> bytes:
    """JOBSUP_WEB_SECRET if set; else the file `path`, made (mode 0600, 32 random bytes) if missing."""
    given = os.environ.get("JOBSUP_WEB_SECRET")
    if given:
        if len(given.encode()) < MIN_SECRET:
            raise BadInput(f"JOBSUP_WEB_SECRET must be at least {MIN_SECRET} characters")
        return given.encode()
    if not path:
        raise BadInput("a login needs a session secret: set JOBSUP_WEB_SECRET or give --secret-file")
    file = Path(path)
    try:
        if not file.exists():
            file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(32))
        secret = file.read_text().strip().encode()
    except FileExistsError:  # a replica made it between our test and our open: read theirs
        secret = file.read_text().strip().encode()
    except OSError as exc:
        raise BadInput(f"cannot read or make the session secret file {path}: {exc.strerror}") from None
    if len(secret) < MIN_SECRET:
        raise BadInput(f"the session secret file {path} holds fewer than {MIN_SECRET} characters")
    return secret
