"""The Django project of tests/test_django.py: its database is the test's own (JOBSUP_TEST_DJANGO_DSN)."""

import os
import sys

import django

from jobsup.django import database

if django.VERSION < (6, 0):
    # Django's documentation imports `django.tasks`; on Django < 6 the backport is that module, so its
    # examples (tests/django_project/docs/) run unchanged.
    import django_tasks

    sys.modules.setdefault("django.tasks", django_tasks)

SECRET_KEY = "jobsup-tests"
USE_TZ = True
INSTALLED_APPS = ["tests.django_project.docs"] + (["django_tasks"] if django.VERSION < (6, 0) else [])
DATABASES = {"default": database(os.environ.get("JOBSUP_TEST_DJANGO_DSN"))}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
TASKS = {
    "default": {
        "BACKEND": "jobsup.django.JobsupBackend",
        "QUEUES": [],  # any queue: each test works its own
        "OPTIONS": {"max_attempts": 2},
    },
}
