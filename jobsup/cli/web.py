"""`jobsup web`: the console in a browser (the `jobsup[web]` extra), and the users of its login."""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from jobsup.cli.options import duration, env_note, truthy
from jobsup.errors import EXIT_OK, BadInput

HELP = "the console in a browser, behind a login or a token"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_REFRESH = 1.0  # seconds between two reads of the shared figures


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 0 to 65535, not {text!r}")
    return value


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Serve the console in a browser: the overview, dead jobs, a job's page, queues, limits, "
        "workflows, schedules, latency and the audit, live, with the actions of `jobsup top` for "
        "operators. Listens on 127.0.0.1 by default. With users configured (--users-file or "
        "JOBSUP_WEB_USERS) it asks for a login; without, it prints an address with a random token and "
        "serves nothing without it. Needs the web extra: pip install 'jobsup[web]'."
    )
    env = os.environ.get
    p.add_argument(
        "--host",
        default=env("JOBSUP_WEB_HOST", DEFAULT_HOST),
        help=(
            f"address to listen on ({env_note('JOBSUP_WEB_HOST', DEFAULT_HOST)}); any other "
            f"than loopback needs users, or --allow-remote-without-auth"
        ),
    )
    p.add_argument(
        "--port",
        type=_port,
        default=env("JOBSUP_WEB_PORT", str(DEFAULT_PORT)),
        help=f"port to listen on ({env_note('JOBSUP_WEB_PORT', DEFAULT_PORT)})",
    )
    p.add_argument(
        "--users-file",
        default=env("JOBSUP_WEB_USERS_FILE"),
        help=(
            "the users of the login, one `name:role:hash` a line, as --add-user writes them "
            "(env JOBSUP_WEB_USERS_FILE; JOBSUP_WEB_USERS holds users too)"
        ),
    )
    p.add_argument(
        "--secret-file",
        default=env("JOBSUP_WEB_SECRET_FILE"),
        help=(
            "the session secret, made if missing; JOBSUP_WEB_SECRET wins over it (env "
            "JOBSUP_WEB_SECRET_FILE; default ~/.config/jobsup/web-secret)"
        ),
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[h for h in env("JOBSUP_WEB_ALLOWED_HOSTS", "").split(",") if h],
        metavar="NAME",
        help=(
            "a host name the Host header may carry besides loopback and --host, repeatable "
            "(env JOBSUP_WEB_ALLOWED_HOSTS, commas between)"
        ),
    )
    p.add_argument(
        "--allow-remote-without-auth",
        action="store_true",
        default=truthy(env("JOBSUP_WEB_ALLOW_REMOTE_WITHOUT_AUTH", "")),
        help=(
            "listen on a non-loopback address with no users: the token alone guards it (env "
            "JOBSUP_WEB_ALLOW_REMOTE_WITHOUT_AUTH=1)"
        ),
    )
    p.add_argument(
        "--trusted-proxy",
        default=env("JOBSUP_WEB_TRUSTED_PROXY"),
        metavar="ADDRESSES",
        help=(
            "the reverse proxy whose X-Forwarded-Proto and X-Forwarded-For are believed: "
            "addresses or networks, commas between, or * (env JOBSUP_WEB_TRUSTED_PROXY; "
            "default none)"
        ),
    )
    p.add_argument(
        "--root-path",
        default=env("JOBSUP_WEB_ROOT_PATH", ""),
        help="the path prefix a reverse proxy serves it under, e.g. /jobsup (env JOBSUP_WEB_ROOT_PATH)",
    )
    p.add_argument(
        "--refresh",
        type=duration,
        default=env("JOBSUP_WEB_REFRESH", str(DEFAULT_REFRESH)),
        help=(
            f"time between two reads of the figures, shared by every open page "
            f"({env_note('JOBSUP_WEB_REFRESH', f'{DEFAULT_REFRESH:g}s')})"
        ),
    )
    p.add_argument(
        "--token",
        default=env("JOBSUP_WEB_TOKEN"),
        help=(
            "the token of the address when no users are configured (env JOBSUP_WEB_TOKEN; "
            "default a random one each start)"
        ),
    )
    p.add_argument(
        "--hash-password",
        action="store_true",
        help=(
            "read a password (twice on a terminal, else one line of standard input), print "
            "its hash for JOBSUP_WEB_USERS, and exit"
        ),
    )
    p.add_argument(
        "--add-user",
        metavar="NAME",
        help=(
            "add NAME (or replace its role and password) in --users-file, reading the "
            "password as --hash-password does, and exit"
        ),
    )
    p.add_argument(
        "--role", default="viewer", choices=("viewer", "operator"), help="the role of --add-user (default viewer)"
    )
    p.set_defaults(run=run)


def _password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("password: ")
        if getpass.getpass("again: ") != first:
            raise BadInput("the two passwords differ; nothing was written")
        return first
    return sys.stdin.readline().rstrip("\n")


def run(args: argparse.Namespace) -> int:
    try:
        from jobsup.web import passwords
    except ImportError as exc:  # starlette or uvicorn missing
        raise BadInput(f"jobsup web needs the web extra: pip install 'jobsup[web]' ({exc})") from None
    if args.hash_password:
        print(passwords.hash_password(_password()))
        return EXIT_OK
    if args.add_user:
        from jobsup.web import users

        if not args.users_file:
            raise BadInput("--add-user writes into --users-file (or JOBSUP_WEB_USERS_FILE): name the file")
        user = users.User(users.check_name(args.add_user), args.role, passwords.hash_password(_password()))
        replaced = users.add(args.users_file, user)
        print(f"{'replaced' if replaced else 'added'} {user.name} ({user.role}) in {args.users_file}")
        return EXIT_OK

    from jobsup.db import dsn as dsns
    from jobsup.db.migrate import require_schema
    from jobsup.web import users
    from jobsup.web.serve import Options, check, serve

    # Refused before the database is resolved: an embedded server is not started for nothing.
    check(args.host, users.load(args.users_file), args.allow_remote_without_auth)
    dsn = dsns.resolve(args.dsn, args.data_dir)
    with dsns.connect(dsn) as conn:
        require_schema(conn)
    serve(
        Options(
            dsn=dsn,
            host=args.host,
            port=int(args.port),
            users_file=args.users_file,
            secret_file=args.secret_file,
            allowed_hosts=args.allowed_host,
            allow_remote_without_auth=args.allow_remote_without_auth,
            trusted_proxy=args.trusted_proxy,
            root_path=args.root_path,
            refresh=float(args.refresh),
            token=args.token,
        )
    )
    return EXIT_OK
