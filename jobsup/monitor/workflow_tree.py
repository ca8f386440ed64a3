"""Moved: the workflow tree is jobsup.ops.workflow_tree (shared with `jobsup workflow`), the share and
percentage of a workflow's progress are jobsup.monitor.formats. This module answers the old names, with a
DeprecationWarning, for one release."""

from __future__ import annotations

import warnings
from collections.abc import Collection
from typing import Any

from jobsup.ops import workflow_tree as _tree
from jobsup.ops.workflows import WorkflowView

# The fold width this module had: the console's (a module global would answer without the warning).
_FANOUT = 5
_MOVED = {
    "Line": _tree,
    "MAX_INDENT": _tree,
    "STATUSES": _tree,
    "ENDED": _tree,
}
_FORMATS = ("progress", "percent")


def _tree_with_the_old_default(
    view: WorkflowView, expanded: Collection[str] = (), fanout: int = _FANOUT
) -> list[_tree.Line]:
    return _tree.tree(view, expanded, fanout=fanout)


def __getattr__(name: str) -> Any:
    value: Any
    if name == "tree":
        new, value = "jobsup.ops.workflow_tree.tree", _tree_with_the_old_default
    elif name == "FANOUT":
        new, value = "the fold width, now an argument of jobsup.ops.workflow_tree.tree", _FANOUT
    elif name in _MOVED:
        new, value = f"jobsup.ops.workflow_tree.{name}", getattr(_tree, name)
    elif name in _FORMATS:
        from jobsup.monitor import formats

        new, value = f"jobsup.monitor.formats.{name}", getattr(formats, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"jobsup.monitor.workflow_tree.{name} moved: use {new}", DeprecationWarning, stacklevel=2)
    return value
