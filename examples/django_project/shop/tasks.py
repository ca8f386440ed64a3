"""The example's two tasks: a sync one that takes its context (and fails its first attempt for some
addresses, to show a retry), and an async one."""

import asyncio

from django.core.mail import send_mail

try:
    from django.tasks import TaskContext, task  # Django 6
except ImportError:
    from django_tasks import TaskContext, task  # the backport, Django 4.2-5.2


@task(queue_name="emails", priority=10, takes_context=True)
def send_welcome(context: TaskContext, address: str) -> dict:
    if address.startswith("flaky") and context.attempt == 1:
        raise ConnectionError(f"mail server refused {address} (attempt {context.attempt})")
    sent = send_mail("Welcome", "Glad you are here.", None, [address])
    return {"sent": sent, "attempt": context.attempt}


@task
async def word_count(text: str) -> dict:
    await asyncio.sleep(0.01)  # an async task: awaits like any coroutine
    words = text.split()
    return {"words": len(words), "longest": max(words, key=len) if words else None}
