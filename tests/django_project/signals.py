"""Receivers of the task signals that write each one as a line of JSON to the file JOBSUP_TEST_SIGNALS
names (tests/test_django.py reads it): the test's process sends task_enqueued, the workers the others."""

import json
import os

import django
from django.dispatch import receiver

# The backport's own module: settings.py makes `django.tasks` the backport on Django < 6, but a submodule
# imported through that name would be a second copy, with signals of its own that no backend sends.
if django.VERSION >= (6, 0):
    from django.tasks.signals import task_enqueued, task_finished, task_started
else:
    from django_tasks.signals import task_enqueued, task_finished, task_started


def _record(signal: str, sender, task_result, **kwargs) -> None:
    path = os.environ.get("JOBSUP_TEST_SIGNALS")
    if not path:
        return
    line = {
        "signal": signal,
        "sender": f"{sender.__module__}.{sender.__qualname__}",
        "id": task_result.id,
        "task": task_result.task.module_path,
        "args": task_result.args,
        "status": str(task_result.status),
        "attempts": task_result.attempts,
        "errors": [e.exception_class_path for e in task_result.errors],
    }
    if signal != "task_enqueued":
        line["started"] = task_result.started_at is not None
        line["finished"] = task_result.finished_at is not None
        line["worker_pid"] = os.getpid()
    if str(task_result.status) == "SUCCESSFUL":
        line["return_value"] = task_result.return_value
    with open(path, "a") as out:  # one write of one line: the workers' lines do not interleave
        out.write(json.dumps(line) + "\n")


@receiver(task_enqueued)
def enqueued(sender, task_result, **kwargs):
    _record("task_enqueued", sender, task_result)


@receiver(task_started)
def started(sender, task_result, **kwargs):
    _record("task_started", sender, task_result)


@receiver(task_finished)
def finished(sender, task_result, **kwargs):
    _record("task_finished", sender, task_result)
