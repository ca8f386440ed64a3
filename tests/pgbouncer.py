"""A real PgBouncer in transaction pooling mode in front of the test server, for the pooler tests.

Debian's `pgbouncer` package provides the binary (`make test` installs it when it is missing and the
user is root). Each session starts its own process, with a config file in a temporary directory, on the
first free port of 6471-6479, and stops it at the end.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from psycopg import conninfo

from .helpers import wait_for

PORTS = range(6471, 6480)


def binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )


def _free_port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError(f"no free port for pgbouncer in {PORTS.start}-{PORTS.stop - 1}")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@contextmanager
def running(server_dsn: str, *, pool_size: int = 20) -> Iterator[str]:
    """A PgBouncer (transaction mode) in front of `server_dsn`; yields a DSN of it, database name left
    for the caller (with_dbname) to set: the wildcard entry forwards every database of the server."""
    exe = binary()
    assert exe is not None
    server = conninfo.conninfo_to_dict(server_dsn)
    user = server.get("user") or pwd.getpwuid(os.getuid()).pw_name
    target = " ".join(
        f"{key}={_quote(str(server[key]))}" for key in ("host", "port", "user", "password") if server.get(key)
    )
    port = _free_port()
    home = Path(tempfile.mkdtemp(prefix="jobsup-pgbouncer-"))
    (home / "users.txt").write_text(f'"{user}" ""\n')
    (home / "pgbouncer.ini").write_text(f"""\
[databases]
* = {target}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {home / "users.txt"}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 500
; psycopg sends no extra_float_digits, but jobsup top sends its settings as `options`; PgBouncer
; refuses parameters it does not know unless told to ignore them.
ignore_startup_parameters = options, extra_float_digits
logfile = {home / "pgbouncer.log"}
pidfile = {home / "pgbouncer.pid"}
server_check_delay = 1
""")
    argv = [exe, str(home / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root; the embedded server's own user can reach its socket.
        owner = Path(server["host"]).stat().st_uid if str(server.get("host", "")).startswith("/") else None
        name = pwd.getpwuid(owner).pw_name if owner not in (None, 0) else "nobody"
        shutil.chown(home, name)
        for child in home.iterdir():
            shutil.chown(child, name)
        argv += ["-u", name]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    dsn = f"postgresql://{user}@127.0.0.1:{port}/postgres"
    try:
        wait_for(lambda: _accepts(port) or process.poll() is not None, 20, message="pgbouncer to listen")
        if process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited {process.returncode}: {_log(home)}")
        yield dsn
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(home, ignore_errors=True)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _log(home: Path) -> str:
    try:
        return (home / "pgbouncer.log").read_text()[-2000:]
    except OSError:
        return "(no log)"
