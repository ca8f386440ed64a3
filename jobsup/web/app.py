"""The ASGI application: `create_app` for a host application to mount, `standalone` for `jobsup web`."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from importlib import resources

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobsup.errors import BadInput, DatabaseUnavailable, JobsupError
from jobsup.web import actions, job_views, login, views
from jobsup.web.access import Access
from jobsup.web.auth import Auth, HostAuth, Identify, LoginAuth
from jobsup.web.board import REFRESH, Boards
from jobsup.web.database import Database
from jobsup.web.layout import message
from jobsup.web.sessions import Signer
from jobsup.web.throttle import Throttle


async def live(request: Request) -> Response:
    """What the script polls: the board's version, or why it cannot be read. Served from the board."""
    boards = request.app.state.boards
    try:
        board = await boards.current()
    except (DatabaseUnavailable, JobsupError) as exc:
        return JSONResponse({"error": f"The database cannot be reached: {exc}"}, headers={"Cache-Control": "no-store"})
    return JSONResponse({"version": board.version}, headers={"Cache-Control": "no-store"})


async def healthz(request: Request) -> Response:
    """For a load balancer: 200 when the board can be read (the database answers), 503 otherwise."""
    try:
        await request.app.state.boards.current()
    except (DatabaseUnavailable, JobsupError) as exc:
        return PlainTextResponse(f"database unavailable: {exc}\n", status_code=503)
    return PlainTextResponse("ok\n")


async def not_found(request: Request, exc: Exception) -> Response:
    return message(request, "Not found", "There is no such page.", 404)


def _routes() -> list[Route | Mount]:
    static = resources.files("jobsup.web").joinpath("static")
    return [
        Route("/", views.overview_page),
        Route("/dead", views.dead_page),
        Route("/dead/confirm", job_views.confirm_requeue),
        Route("/queues", views.queues_page),
        Route("/limits", views.limits_page),
        Route("/workflows", views.workflows_page),
        Route("/workflows/{id}", job_views.workflow_page),
        Route("/schedules", views.schedules_page),
        Route("/latency", views.latency_page),
        Route("/audit", job_views.audit_page),
        Route("/jobs/{id}", job_views.job_page),
        Route("/live.json", live),
        Route("/healthz", healthz),
        Route("/login", login.login_page, methods=["GET"]),
        Route("/login", login.login, methods=["POST"]),
        Route("/logout", actions.logout, methods=["POST"]),
        Route("/actions/requeue", actions.requeue, methods=["POST"]),
        Route("/actions/cancel", actions.cancel, methods=["POST"]),
        Route("/actions/retry", actions.retry, methods=["POST"]),
        Route("/actions/pause", actions.pause_queue, methods=["POST"]),
        Route("/actions/resume", actions.resume_queue, methods=["POST"]),
        Route("/actions/schedule-pause", actions.pause_schedule, methods=["POST"]),
        Route("/actions/schedule-resume", actions.resume_schedule, methods=["POST"]),
        Route("/actions/limit", actions.set_limit, methods=["POST"]),
        Route("/actions/limit-reset", actions.reset_limit, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]


def build(
    dsn: str,
    auth: Auth,
    *,
    secret: bytes | None = None,
    allowed_hosts: Sequence[str] | None = None,
    refresh: float = REFRESH,
) -> Starlette:
    """The app with `auth` deciding who is asking (jobsup.web.auth)."""
    if refresh <= 0:
        raise BadInput("refresh must be more than 0 seconds")
    app = Starlette(routes=_routes(), middleware=[Middleware(Access)], exception_handlers={404: not_found})
    db = Database(dsn)
    app.state.db = db
    app.state.boards = Boards(db, refresh)
    app.state.auth = auth
    # Without a secret of its own (a mounted app given none), one per process: forms then fail across
    # replicas and restarts, so the guide says to pass one.
    app.state.signer = Signer(secret or secrets.token_bytes(32))
    app.state.allowed_hosts = list(allowed_hosts) if allowed_hosts is not None else None
    app.state.throttle = Throttle()
    return app


def create_app(
    dsn: str,
    identify: Identify | None = None,
    *,
    secret: bytes | str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    refresh: float = REFRESH,
) -> Starlette:
    """The web console to mount in a host application (FastAPI, Starlette, Django through ASGI) at any
    path. `identify(request)` (a function or a coroutine function) names who is asking, as
    `(user, role)` with role "viewer" or "operator", or None for nobody signed in (a 401 page): the host
    application's own login decides. `secret` signs the CSRF tokens: give every replica the same one.
    `allowed_hosts` limits the Host header (None: the host application checks it). `refresh`: seconds
    between two reads of the shared figures."""
    if identify is None:
        raise BadInput(
            "create_app needs identify=: a callable mapping a request to (user, role), so that the web "
            "console is never mounted open to anyone"
        )
    key = secret.encode() if isinstance(secret, str) else secret
    return build(dsn, HostAuth(identify), secret=key, allowed_hosts=allowed_hosts, refresh=refresh)


__all__ = ["LoginAuth", "build", "create_app"]
