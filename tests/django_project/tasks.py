"""Tasks the supervisor runs in tests/test_django.py."""

import asyncio
import os

from django.tasks import TaskContext, task

# Its receivers record the task signals; imported with the tasks, so the workers connect them too.
from tests.django_project import signals  # noqa: F401


@task
def add(a, b):
    return a + b


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return {"sum": a + b, "async": True}


@task(takes_context=True)
def with_context(context: TaskContext, note):
    return {
        "attempt": context.attempt,
        "id": context.task_result.id,
        "note": note,
        "status": str(context.task_result.status),
    }


@task
def always_fails(reason):
    raise ValueError(f"always fails: {reason}")


@task(takes_context=True)
def fails_once(context: TaskContext):
    if context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return context.attempt


@task
def returns_set():
    return {1, 2}


@task
def pid():
    return os.getpid()


@task
def record(num):
    """Leaves a row behind, so a test can see the order tasks ran in."""
    from tests.django_project.docs.models import Thing

    Thing.objects.create(num=num)
