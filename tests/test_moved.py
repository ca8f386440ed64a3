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


# The worker process's code left jobsup.supervisor for jobsup.worker, where jobsup.testing reaches it too.
WORKER_MOVES = {
    "jobsup.supervisor.worker": {
        "Runner": "jobsup.worker.runner",
        "run_hooks": "jobsup.worker.runner",
        "worker_main": "jobsup.worker.main",
        "PARENT_CHECK_INTERVAL": "jobsup.worker.main",
        "job_fields": "jobsup.worker.messages",
        "job_of": "jobsup.worker.messages",
        "column_json": "jobsup.worker.messages",
    },
    "jobsup.supervisor.wire": {"Reader": "jobsup.worker.wire", "send": "jobsup.worker.wire"},
    "jobsup.supervisor.sharing": {
        name: "jobsup.worker.sharing" for name in ("Shared", "culprit_of_fault", "job_ids_in", "JOB_FRAME", "TICK")
    },
}


@pytest.mark.parametrize("old", sorted(WORKER_MOVES))
def test_the_old_paths_of_the_worker_process_warn_and_give_the_new_objects(old: str):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to jobsup.worker"):
        shim = importlib.import_module(old)
    for name, new in WORKER_MOVES[old].items():
        assert getattr(shim, name) is getattr(importlib.import_module(new), name), name


def test_the_old_path_of_exit_cause_warns():
    from jobsup.supervisor import keeper
    from jobsup.worker import main

    with pytest.warns(DeprecationWarning, match="keeper.exit_cause moved to jobsup.worker.main.exit_cause"):
        assert keeper.exit_cause is main.exit_cause
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        keeper.nothing  # noqa: B018


def test_the_names_the_dispatcher_held_before_its_rooms_warn_and_give_the_new_objects():
    from jobsup.supervisor import dispatcher

    for name, module in dispatcher._MOVED.items():
        new = importlib.import_module(f"jobsup.supervisor.{module}")
        with pytest.warns(DeprecationWarning, match=f"dispatcher.{name} moved to jobsup.supervisor.{module}"):
            assert getattr(dispatcher, name) is getattr(new, name), name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dispatcher.nothing  # noqa: B018
    # The name the suite imported from the dispatcher before is among them; Wakeup, which the dispatcher
    # uses itself, stays one of its names.
    assert {"HANDOUT_MAX", "SHORT_JOB", "WRITE_MAX"} <= set(dispatcher._MOVED)
    assert dispatcher.Wakeup is importlib.import_module("jobsup.supervisor.wakeup").Wakeup
