"""The page around every view: the navigation, who is signed in, the database banner, the live
marker the script reads. Links are relative to where the app is mounted (the request's root path)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import HTMLResponse

from jobsup.web.html import Markup, Node, render, tag
from jobsup.web.sessions import CSRF_COOKIE

NAV = (
    ("/", "Overview"),
    ("/dead", "Dead jobs"),
    ("/queues", "Queues"),
    ("/limits", "Limits"),
    ("/workflows", "Workflows"),
    ("/schedules", "Schedules"),
    ("/latency", "Latency"),
    ("/audit", "Audit"),
)
FRAGMENT_HEADER = "x-jobsup-fragment"  # the script asks for the <main> part alone with it


@dataclass(frozen=True)
class Identity:
    user: str
    role: str

    @property
    def operator(self) -> bool:
        return self.role == "operator"


def href(request: Request, path: str) -> str:
    """`path` below the app's mount point."""
    return request.scope.get("root_path", "").rstrip("/") + path


def identity(request: Request) -> Identity | None:
    return getattr(request.state, "identity", None)


def can_act(request: Request) -> bool:
    who = identity(request)
    return who is not None and who.operator


def csrf_field(request: Request) -> Markup:
    """The hidden fields of every form: its CSRF token, and the page to go back to after it (no
    Referer is sent: the pages' Referrer-Policy is no-referrer)."""
    signer = request.app.state.signer
    return Markup(
        tag("input", type="hidden", name="csrf", value=signer.csrf(request.state.csrf_cookie))
        + tag("input", type="hidden", name="back", value=request.url.path)
    )


def form(
    request: Request, action: str, label: str, *fields: Node, confirm: str | None = None, danger: bool = False
) -> Markup:
    """A POST form of one button, with the CSRF token; nothing for a viewer (no button to press)."""
    if not can_act(request):
        return Markup("")
    return tag(
        "form",
        csrf_field(request),
        *fields,
        tag("button", label, type="submit", class_="danger" if danger else None, data_confirm=confirm),
        method="post",
        action=href(request, action),
        class_="inline",
    )


def hidden(name: str, value: object) -> Markup:
    return tag("input", type="hidden", name=name, value=str(value))


def page(
    request: Request,
    title: str,
    body: Node,
    *,
    live: str = "always",
    version: str = "",
    status: int = 200,
    banner: str | None = None,
    notice: str | None = None,
) -> HTMLResponse:
    """The page, or only its <main> when the script asks for it (the live refresh). `live`: "always"
    (read again each interval), "change" (when the board's version changes) or "off"."""
    main_inner = render(
        [
            tag("div", banner, class_="banner", id="banner", role="alert", hidden=not banner),
            tag("p", notice, class_="notice") if notice else None,
            tag("h1", title),
            body,
        ]
    )
    headers = {"Cache-Control": "no-store"}
    if request.headers.get(FRAGMENT_HEADER):
        return HTMLResponse(main_inner, status_code=status, headers=headers)
    who = identity(request)
    here = request.url.path.removeprefix(request.scope.get("root_path", "").rstrip("/")) or "/"
    nav = tag(
        "nav",
        tag("span", "jobsup", class_="brand"),
        [tag("a", label, href=href(request, path), class_="here" if here == path else None) for path, label in NAV],
        tag("span", f"{who.user} ({who.role})" if who else "", class_="who"),
        logout(request) if who and request.app.state.auth.can_logout else None,
    )
    document = tag(
        "html",
        tag(
            "head",
            tag("meta", charset="utf-8"),
            tag("meta", name="viewport", content="width=device-width, initial-scale=1"),
            tag("title", f"{title} · jobsup"),
            tag("link", rel="stylesheet", href=href(request, "/static/jobsup.css")),
            tag("script", src=href(request, "/static/jobsup.js"), defer=True),
        ),
        tag(
            "body",
            nav,
            tag(
                "main",
                main_inner,
                id="main",
                data_live=live,
                data_version=version,
                data_poll=href(request, "/live.json"),
            ),
        ),
        lang="en",
    )
    return HTMLResponse("<!doctype html>" + document, status_code=status, headers=headers)


def logout(request: Request) -> Markup:
    return tag(
        "form",
        csrf_field(request),
        tag("button", "Sign out", type="submit"),
        method="post",
        action=href(request, "/logout"),
        class_="inline",
    )


def message(request: Request, title: str, text: str, status: int) -> HTMLResponse:
    """A page that says one thing: an error (404, 400, 403) or a refusal."""
    return page(request, title, tag("p", text), live="off", status=status)


__all__ = ["CSRF_COOKIE", "Identity", "form", "href", "page"]
