"""What the web console's tests share: the state they put in the queue (through the queue's own
functions), the apps they build, and a real `jobsup web` server on loopback."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from starlette.testclient import TestClient

from jobsup import client
from jobsup.db import lifecycle
from jobsup.db.lifecycle import Failure
from jobsup.web.app import build
from jobsup.web.auth import LoginAuth, TokenAuth
from jobsup.web.passwords import hash_password
from jobsup.web.sessions import Signer
from jobsup.web.users import User

from .helpers import ROOT, cli_env, wait_for

SECRET = b"s" * 32
TOKEN = "test-token-123"
LOOPBACK = ["127.0.0.1", "localhost", "::1"]
# Hashed once per test session: scrypt takes a tenth of a second each.
PASSWORDS = {"olga": "operator-pw", "vic": "viewer-pw"}
_HASHES: dict[str, str] = {}


def users() -> dict[str, User]:
    if not _HASHES:
        _HASHES.update({name: hash_password(pw) for name, pw in PASSWORDS.items()})
    return {"olga": User("olga", "operator", _HASHES["olga"]), "vic": User("vic", "viewer", _HASHES["vic"])}


def make_dead(
    conn: psycopg.Connection, kind: str, error: str, n: int = 1, queue: str = "default", payload=None
) -> list[int]:
    """`n` jobs of `kind` that end dead with `error`, through claim and fail as a supervisor does."""
    ids = [
        client.enqueue(conn, kind, payload if payload is not None else {"n": i}, max_attempts=1, queue=queue)
        for i in range(n)
    ]
    claimed = lifecycle.claim(conn, [queue], n, "sup-test", 30)
    lifecycle.fail(conn, [Failure(job.id, 1, error) for job in claimed], "sup-test")
    return [i for i in ids if i is not None]


def token_client(dsn: str, refresh: float = 0.05) -> TestClient:
    app = build(dsn, TokenAuth(Signer(SECRET), TOKEN), secret=SECRET, allowed_hosts=LOOPBACK, refresh=refresh)
    return TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)


def login_client(dsn: str, refresh: float = 0.05) -> TestClient:
    app = build(dsn, LoginAuth(users(), Signer(SECRET)), secret=SECRET, allowed_hosts=LOOPBACK, refresh=refresh)
    return TestClient(app, base_url="http://127.0.0.1", follow_redirects=False)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def sign_in(web: TestClient, name: str) -> None:
    page = web.get("/login")
    answer = web.post("/login", data={"user": name, "password": PASSWORDS[name], "csrf": csrf_of(page.text)})
    assert answer.status_code == 303, answer.text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def web_server(dsn: str, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A real `jobsup web` on loopback; yields the address it printed (with the token, without users)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobsup", "web", "--dsn", dsn, "--port", str(port), "--token", TOKEN, *args],
        cwd=ROOT,
        env=cli_env(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("jobsup web: serving "), (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split("serving ", 1)[1].strip()

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, message="jobsup web listening")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()


def main_of(html: str) -> str:
    """The <main> part of a page: what the page shows, without the navigation (and its Sign out)."""
    return html.split("<main", 1)[1].split("</main>", 1)[0]
