"""The standalone login page: a user name and a password checked against the users' hashes, attempts
throttled per address and per name, a signed session cookie on success."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from jobsup.web.access import Refused, guard
from jobsup.web.auth import LoginAuth, set_session
from jobsup.web.html import tag
from jobsup.web.layout import csrf_field, href, page
from jobsup.web.passwords import hash_password, verify

# Checked when the name is unknown, so a wrong name costs the time a wrong password does.
_DUMMY_HASH = hash_password("not a password of anyone")


def _form(request: Request, error: str | None = None, status: int = 200) -> Response:
    body = tag(
        "form",
        csrf_field(request),
        tag("p", error, class_="error", id="login-error") if error else None,
        tag("label", "User", tag("input", name="user", autocomplete="username", required=True, autofocus=True)),
        tag("label", "Password", tag("input", name="password", type="password", autocomplete="current-password")),
        tag("button", "Sign in", type="submit"),
        method="post",
        action=href(request, "/login"),
        class_="stack",
        id="login",
    )
    return page(request, "Sign in", body, live="off", status=status)


async def login_page(request: Request) -> Response:
    return _form(request)


async def login(request: Request) -> Response:
    auth = request.app.state.auth
    assert isinstance(auth, LoginAuth)
    try:
        form = await guard(request, operator=False)
    except Refused as refused:
        return _form(request, refused.reason, refused.status)
    name, password = form.get("user", ""), form.get("password", "")
    address = request.client.host if request.client else "?"
    throttle = request.app.state.throttle
    wait = throttle.wait(address, name)
    if wait > 0:
        return _form(request, f"Too many failed attempts: try again in {wait:.0f} s.", 429)
    user = auth.users.get(name)
    # scrypt takes a tenth of a second: in a thread, so the other pages are not held up meanwhile.
    ok = await asyncio.to_thread(verify, password, user.hash if user else _DUMMY_HASH)
    if user is None or not ok:
        throttle.failed(address, name)
        return _form(request, "Wrong user name or password.", 401)
    response = RedirectResponse(href(request, "/"), status_code=303)
    set_session(response, request, auth.signer, user.name)
    return response
