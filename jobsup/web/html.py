"""HTML built from escaped text: every string that is not `Markup` is escaped when it is rendered, so a
payload or an error holding `<script>` is shown, never run. No template engine, no inline script."""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from typing import Union

Node = Union["Markup", str, int, float, None, Iterable["Node"]]


class Markup(str):
    """Text that is HTML already (built by `tag`): rendered as it is."""


def render(node: Node) -> Markup:
    """
    >>> render(["<b>", Markup("<i>x</i>"), None, 3])
    '&lt;b&gt;<i>x</i>3'
    """
    if node is None:
        return Markup("")
    if isinstance(node, Markup):
        return node
    if isinstance(node, str):
        return Markup(escape(node))
    if isinstance(node, int | float):
        return Markup(escape(str(node)))
    return Markup("".join(render(child) for child in node))


def tag(element: str, /, *children: Node, **attrs: object) -> Markup:
    """An element; `class_` is `class`, `data_x` is `data-x`, True is a bare attribute, None or False
    leaves the attribute out.

    >>> tag("a", "1 < 2", href="/x?a=1&b=2", class_="k", hidden=True, title=None)
    '<a href="/x?a=1&amp;b=2" class="k" hidden>1 &lt; 2</a>'
    """
    parts = [element]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        key = key.rstrip("_").replace("_", "-")
        parts.append(key if value is True else f'{key}="{escape(str(value), quote=True)}"')
    opening = f"<{' '.join(parts)}>"
    if element in ("input", "meta", "link", "br"):
        return Markup(opening)
    return Markup(f"{opening}{render(list(children))}</{element}>")


def table(headers: Iterable[str], rows: Iterable[Iterable[Node]], *, empty: str = "none", **attrs: object) -> Markup:
    """A table; a row of cells per row, `empty` in one cell when there is no row."""
    headers = list(headers)
    head = tag("thead", tag("tr", [tag("th", h) for h in headers])) if any(headers) else None
    body = [tag("tr", [tag("td", cell) for cell in row]) for row in rows]
    if not body:
        body = [tag("tr", tag("td", empty, colspan=len(headers) or 1, class_="empty"))]
    return tag("table", head, tag("tbody", body), **attrs)
