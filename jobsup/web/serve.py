"""`jobsup web` alone: the app behind the login (users configured) or a token (none), refused on a
non-loopback address without authentication, run by uvicorn. The command line parses; this builds."""

from __future__ import annotations

import ipaddress
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from jobsup.errors import BadInput
from jobsup.web import users as web_users
from jobsup.web.app import build
from jobsup.web.auth import Auth, LoginAuth, TokenAuth
from jobsup.web.sessions import Signer, load_secret

# Where the session secret is kept when neither JOBSUP_WEB_SECRET nor --secret-file names one.
DEFAULT_SECRET_FILE = Path.home() / ".config" / "jobsup" / "web-secret"
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """
    >>> [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "10.1.2.3", "example.org")]
    [True, True, True, False, False, False]
    """
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Options:
    dsn: str
    host: str
    port: int
    users_file: str | None
    secret_file: str | None
    allowed_hosts: Sequence[str]
    allow_remote_without_auth: bool
    trusted_proxy: str | None
    root_path: str
    refresh: float
    token: str | None


def allowed_hosts(options: Options) -> list[str]:
    """The Host headers answered: the loopback names, the address listened on, and those given;
    any, on a wildcard address with none given (a login or a token guards it then)."""
    given = list(options.allowed_hosts)
    if options.host in ("0.0.0.0", "::", "") and not given:
        return ["*"]
    return ["127.0.0.1", "localhost", "::1", options.host.strip("[]"), *given]


def check(host: str, users: dict[str, web_users.User], allow_remote_without_auth: bool) -> None:
    """BadInput (one line, exit 2) for a non-loopback address with no users, unless allowed."""
    if not users and not is_loopback(host) and not allow_remote_without_auth:
        raise BadInput(
            f"refusing to listen on {host} without authentication: configure users "
            "(--users-file or JOBSUP_WEB_USERS), or pass --allow-remote-without-auth to serve it "
            "behind the token alone"
        )


def prepare(options: Options) -> tuple[object, str]:
    """The app and the address to print; BadInput (one line, exit 2) for a refused configuration."""
    users = web_users.load(options.users_file)
    check(options.host, users, options.allow_remote_without_auth)
    auth: Auth
    if users:
        secret = load_secret(options.secret_file or str(DEFAULT_SECRET_FILE))
        auth = LoginAuth(users, Signer(secret))
    else:
        secret = secrets.token_bytes(32)
        auth = TokenAuth(Signer(secret), options.token)
    app = build(options.dsn, auth, secret=secret, allowed_hosts=allowed_hosts(options), refresh=options.refresh)
    shown = options.host if ":" not in options.host else f"[{options.host}]"
    if shown in ("0.0.0.0", "[::]"):
        shown = "127.0.0.1"
    url = f"http://{shown}:{options.port}{options.root_path.rstrip('/')}/"
    if isinstance(auth, TokenAuth):
        url += f"?token={auth.token}"
    return app, url


def serve(options: Options) -> None:
    app, url = prepare(options)
    import uvicorn

    print(f"jobsup web: serving {url}", flush=True)
    if not sys.stdout.isatty():
        sys.stdout.flush()
    uvicorn.run(
        app,  # type: ignore[arg-type]
        host=options.host,
        port=options.port,
        log_level="warning",
        access_log=False,
        proxy_headers=options.trusted_proxy is not None,
        forwarded_allow_ips=options.trusted_proxy or "",
        root_path=options.root_path,
        server_header=False,
    )
