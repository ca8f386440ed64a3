"""The task of benchmarks/bench_django.py (imported once Django is set up)."""

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def noop():
    pass
