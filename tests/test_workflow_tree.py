"""The one workflow tree (jobsup.ops.workflow_tree) that `jobsup workflow` prints and the console draws,
each folding at a width of its own; and the old import path, which still answers with a warning."""

from __future__ import annotations

import importlib
import warnings
from datetime import UTC, datetime

import pytest

from jobsup.cli import workflow as cli_workflow
from jobsup.monitor import workflow_panels
from jobsup.ops import workflow_tree
from jobsup.ops.workflows import Member, WorkflowView

T = datetime(2026, 1, 1, tzinfo=UTC)


def member(i: int, kind: str, parents: tuple[int, ...] = (), status: str = "queued") -> Member:
    return Member(i, kind, status, 0, 3, T, None, None, None, 0, list(parents))


def fan(n: int) -> WorkflowView:
    """1 scan → n parse → 1 report."""
    members = [member(1, "scan", status="done"), *(member(i, "parse", (1,)) for i in range(2, n + 2))]
    members.append(member(n + 2, "report", tuple(range(2, n + 2)), "waiting"))
    return WorkflowView(7, "ingest", T, None, None, members)


def test_the_fold_width_is_the_callers():
    """The console folds past 5 siblings of a kind, the command past 20: one tree, two widths."""
    view = fan(6)
    console = [line.prefix + line.key for line in workflow_tree.tree(view, fanout=workflow_panels.FANOUT)]
    assert console == ["1", "└─ fold:1/parse", "   └─ 8"]
    printed = cli_workflow._tree(view)
    assert len(printed) == 1 + 6 + 1 and printed[1].startswith("  job 2 (parse): queued")
    # Unfolded, the report stands under its first parent, naming the others.
    assert printed[2] == "    job 8 (report): waiting for 0 of 6 parents, after 3, 4, 5, 6, 7"
    assert cli_workflow._tree(fan(21))[1] == "  21 jobs (parse), ids 2 to 22: 21 queued"


def test_a_deep_chain_is_drawn_to_its_end():
    """Its depth goes on where the console's branches stop growing, so the command can say it."""
    members = [member(1, "step"), *(member(i, "step", (i - 1,)) for i in range(2, 31))]
    view = WorkflowView(1, None, T, None, None, members)
    lines = workflow_tree.tree(view, fanout=20)
    assert [line.depth for line in lines] == list(range(30))
    assert [line.under for line in lines] == [None, *range(1, 30)]
    assert lines[-1].prefix.startswith("…") and len(lines[-1].prefix) == 3 * workflow_tree.MAX_INDENT + 1
    assert cli_workflow._tree(view)[-1].startswith("  " * 12 + "[29] job 30 (step)")


def test_the_old_import_path_answers_with_a_deprecation_warning():
    old = importlib.import_module("jobsup.monitor.workflow_tree")
    view = fan(6)
    with pytest.warns(DeprecationWarning, match="jobsup.ops.workflow_tree.tree"):
        tree = old.tree
    assert tree(view) == workflow_tree.tree(view, fanout=5)  # its fold width then: the console's
    with pytest.warns(DeprecationWarning, match="jobsup.ops.workflow_tree.Line"):
        assert old.Line is workflow_tree.Line
    with pytest.warns(DeprecationWarning, match="jobsup.monitor.formats.progress"):
        share = old.progress(1, 0, 2)
    with pytest.warns(DeprecationWarning, match="jobsup.monitor.formats.percent"):
        assert old.percent(share) == "50%"
    with pytest.warns(DeprecationWarning):
        from jobsup.monitor.workflow_tree import STATUSES
    assert STATUSES == workflow_tree.STATUSES
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            _ = old.no_such_name
