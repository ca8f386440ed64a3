"""`jobsup web`: the console in a browser, an ASGI application behind the `jobsup[web]` extra.

`create_app(dsn, identify=...)` builds the app a host application mounts at a path of its choice; `jobsup
web` serves it alone, behind a login or a token. It reads the same functions of `jobsup.ops` as `jobsup
top` and acts through the same control operations, each action recorded in the audit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobsup.web.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so `import jobsup.web` does not need starlette until the app is built.
    if name == "create_app":
        from jobsup.web.app import create_app

        return create_app
    raise AttributeError(name)
