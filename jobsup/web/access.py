"""What every request passes before a view: the Host header, the user, the CSRF cookie, and the
security headers of every answer. POSTs are checked by `guard` (the form's CSRF token and the role)."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import parse_qsl

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from jobsup.web.auth import check_role
from jobsup.web.layout import href, identity, message
from jobsup.web.sessions import CSRF_COOKIE, new_cookie_value

# No inline script or style anywhere: the one script and the one stylesheet are files of the package.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",  # the token of a URL never leaves in a Referer
}
MAX_FORM = 16 * 2**20  # bytes: the ids of a bulk requeue of a million jobs fit
OPEN_PATHS = ("/healthz", "/static/")  # served to anyone who reaches the server


def host_allowed(host_header: str, allowed: Sequence[str]) -> bool:
    """Whether the Host header names an allowed host (any port): no DNS rebinding to a loopback server.

    >>> host_allowed("127.0.0.1:8080", ["127.0.0.1"]), host_allowed("evil.example:8080", ["127.0.0.1"])
    (True, False)
    >>> host_allowed("[::1]:80", ["::1"]), host_allowed("x", ["*"])
    (True, True)
    """
    if "*" in allowed:
        return True
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    else:
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return host in [a.lower() for a in allowed]


class Access(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await self._checked(request, call_next)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if request.state.new_csrf_cookie:
            response.set_cookie(
                CSRF_COOKIE,
                request.state.csrf_cookie,
                path=href(request, "/"),
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    async def _checked(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        state = request.app.state
        cookie = request.cookies.get(CSRF_COOKIE, "")
        request.state.new_csrf_cookie = not cookie
        request.state.csrf_cookie = cookie or new_cookie_value()
        request.state.identity = None
        if state.allowed_hosts is not None and not host_allowed(request.headers.get("host", ""), state.allowed_hosts):
            return PlainTextResponse("this server does not answer to that host name", status_code=400)
        path = request.url.path.removeprefix(request.scope.get("root_path", "").rstrip("/")) or "/"
        if path.startswith(OPEN_PATHS):
            return await call_next(request)
        who = await state.auth.identify(request)
        if who is None:
            if path in state.auth.open_paths:
                return await call_next(request)
            return state.auth.challenge(request)
        if not check_role(who):
            return message(request, "No access", f"the role {who.role!r} is neither viewer nor operator", 403)
        request.state.identity = who
        return await call_next(request)


class Refused(Exception):
    """A POST refused before it changed anything: its status and its reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def guard(request: Request, *, operator: bool = True) -> dict[str, str]:
    """The form of a POST whose CSRF token is right and whose user may act; Refused (403) otherwise."""
    form = await read_form(request)
    token = form.get("csrf")
    if not isinstance(token, str) or not request.app.state.signer.csrf_valid(request.state.csrf_cookie, token):
        raise Refused(403, "the form's CSRF token is missing or wrong: reload the page and try again")
    who = identity(request)
    if operator and (who is None or not who.operator):
        raise Refused(403, "a viewer cannot change anything: an operator's role is needed")
    return form


async def read_form(request: Request) -> dict[str, str]:
    """An url-encoded form (what the pages' forms send), parsed by the standard library: no multipart
    parser needed. A bulk requeue's form carries its ids: up to MAX_FORM bytes are read."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        raise Refused(415, "a form of the pages is url-encoded")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise Refused(413, f"a form of more than {MAX_FORM:,} bytes")
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
