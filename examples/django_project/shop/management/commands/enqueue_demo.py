"""`python manage.py enqueue_demo`: enqueue the example's tasks inside a transaction, wait for the
supervisor to run them, and print every result."""

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from shop.tasks import send_welcome, word_count


class Command(BaseCommand):
    help = "Enqueue the example's tasks, wait for `jobsup start --django mysite.settings` to run them."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=5, help="tasks of each kind (default 5)")
        parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for results")

    def handle(self, *args, count, wait, **options):
        try:
            with transaction.atomic():
                send_welcome.enqueue("never@example.com")
                raise RuntimeError("rolled back")
        except RuntimeError:
            self.stdout.write("an enqueue inside a rolled-back atomic() block left no task behind")
        with transaction.atomic():  # committed together: the supervisor hears of them at commit
            results = [
                send_welcome.enqueue(f"{'flaky' if n % 3 == 0 else 'user'}{n}@example.com") for n in range(count)
            ]
            results += [word_count.enqueue(f"the quick brown fox number {n} jumps") for n in range(count)]
        self.stdout.write(f"enqueued {len(results)} tasks; waiting for the supervisor…")
        deadline = time.monotonic() + wait
        for result in results:
            while not result.is_finished:
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"task {result.id} is still {result.status} after {wait:g}s: is "
                        "`jobsup start --django mysite.settings --queues default,emails` running?"
                    )
                time.sleep(0.05)
                result.refresh()
        for result in results:
            outcome = (
                result.return_value
                if str(result.status) == "SUCCESSFUL"
                else result.errors[-1].traceback.strip().splitlines()[-1]
            )
            self.stdout.write(
                f"{result.id:>6}  {result.task.name:<12} {result.status:<10} attempts {result.attempts}  {outcome}"
            )
        retried = [r for r in results if r.attempts > 1]
        self.stdout.write(
            f"{len(results)} finished, {len(retried)} after a retry "
            f"(their first error: {retried[0].errors[0].exception_class_path})"
            if retried
            else f"{len(results)} finished"
        )
