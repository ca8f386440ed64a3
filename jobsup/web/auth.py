"""Who is asking: the three ways the web console knows its user.

- `HostAuth`: mounted in a host application, which passes a callable mapping a request to (user, role),
  or None for nobody signed in.
- `LoginAuth`: `jobsup web` with users configured: a login page, a signed session cookie.
- `TokenAuth`: `jobsup web` with no users: a random token printed in a URL, as Jupyter does; the first
  visit with it sets a session cookie, and without either nothing is served.
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from jobsup.errors import BadInput
from jobsup.web.layout import Identity, href, message
from jobsup.web.sessions import SESSION_AGE, SESSION_COOKIE, Signer
from jobsup.web.users import OPERATOR, ROLES, User

Identify = Callable[[Request], "tuple[str, str] | None | Awaitable[tuple[str, str] | None]"]


class Auth:
    can_logout = False
    open_paths: tuple[str, ...] = ()  # paths served to nobody signed in (the login page)

    async def identify(self, request: Request) -> Identity | None:
        raise NotImplementedError

    def challenge(self, request: Request) -> Response:
        return message(request, "Not signed in", "Sign in through the application that serves this page.", 401)


class HostAuth(Auth):
    def __init__(self, identify: Identify) -> None:
        if not callable(identify):
            raise BadInput("identify must be a callable mapping a request to (user, role), or None")
        self._identify = identify

    async def identify(self, request: Request) -> Identity | None:
        found: Any = self._identify(request)
        if inspect.isawaitable(found):
            found = await found
        if found is None:
            return None
        user, role = found
        return Identity(str(user), str(role))


def set_session(response: Response, request: Request, signer: Signer, user: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        signer.session(user),
        max_age=SESSION_AGE,
        path=href(request, "/"),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


class LoginAuth(Auth):
    can_logout = True
    open_paths = ("/login",)

    def __init__(self, users: dict[str, User], signer: Signer) -> None:
        if not users:
            raise BadInput("a login needs at least one user (jobsup web --add-user NAME)")
        self.users = users
        self.signer = signer

    async def identify(self, request: Request) -> Identity | None:
        name = self.signer.session_of(request.cookies.get(SESSION_COOKIE, ""))
        user = self.users.get(name or "")
        # The role is the users' list's now, not the one at login: a user removed or made a viewer
        # loses the rights at once.
        return None if user is None else Identity(user.name, user.role)

    def challenge(self, request: Request) -> Response:
        if request.method == "GET" and not request.headers.get("x-jobsup-fragment"):
            return RedirectResponse(href(request, "/login"), status_code=303)
        return message(request, "Not signed in", "Your session has ended: sign in again.", 401)


class TokenAuth(Auth):
    USER = "token"  # the audit's name for whoever opened the URL with the token

    def __init__(self, signer: Signer, token: str | None = None) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.signer = signer

    async def identify(self, request: Request) -> Identity | None:
        if self.signer.session_of(request.cookies.get(SESSION_COOKIE, "")) == self.USER:
            return Identity(self.USER, OPERATOR)
        return None

    def challenge(self, request: Request) -> Response:
        given = request.query_params.get("token", "")
        if given and secrets.compare_digest(given, self.token):
            # The token leaves the address bar at once (and the history, and a Referer).
            query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            target = request.url.path + (f"?{query}" if query else "")
            response = RedirectResponse(target, status_code=303)
            set_session(response, request, self.signer, self.USER)
            return response
        return message(
            request,
            "Token needed",
            "Open the address `jobsup web` printed when it started: it carries the token.",
            401,
        )


def check_role(identity: Identity) -> bool:
    return identity.role in ROLES
