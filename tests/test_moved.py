"""Internal modules that moved keep their old import paths for one release: each warns with a
DeprecationWarning that names the new path, and gives the very objects of the new one."""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest

# old path -> new path
MOVED_MODULES = {
    "jobsup.supervisor.limits": "jobsup.supervisor.declaration",
    "jobsup.supervisor.metrics": "jobsup.supervisor.exporter",
    "jobsup.ops.cron": "jobsup.ops.schedules",
}


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_warns_and_gives_the_new_modules_names(old: str):
    new = importlib.import_module(MOVED_MODULES[old])
    sys.modules.pop(old, None)  # imported already (by a module not yet changed): import it afresh
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new.__name__}"):
        shim = importlib.import_module(old)
    defined = {
        name
        for name, value in vars(new).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and value.__module__ == new.__name__
    }
    assert defined and defined <= set(vars(shim))
    for name in vars(shim):
        if not name.startswith("_") and name != "warnings":
            assert getattr(shim, name) is getattr(new, name), name


@pytest.mark.parametrize("name", ["Queue", "AsyncQueue"])
def test_the_old_path_of_the_pooled_queues_warns(name: str):
    from jobsup import client, pooled

    with pytest.warns(DeprecationWarning, match=f"jobsup.client.{name} moved to jobsup.pooled.{name}"):
        assert getattr(client, name) is getattr(pooled, name)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        client.Nothing  # noqa: B018


def test_the_public_names_of_the_moved_classes_stay():
    import jobsup
    from jobsup import middleware, outcomes, pooled

    assert jobsup.Queue is pooled.Queue and jobsup.AsyncQueue is pooled.AsyncQueue
    assert jobsup.RunOutcome is middleware.RunOutcome is outcomes.RunOutcome
    assert jobsup.AttemptStopped is middleware.AttemptStopped is outcomes.AttemptStopped
