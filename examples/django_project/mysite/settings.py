"""Settings of the example project: Django's Tasks framework with jobsup as its backend."""

import django

from jobsup.django import database

SECRET_KEY = "jobsup-example-not-secret"
DEBUG = True
USE_TZ = True
# On Django < 6 the Tasks framework is the django-tasks backport, an app of its own.
INSTALLED_APPS = ["shop"] + (["django_tasks"] if django.VERSION < (6, 0) else [])
# The database jobsup uses: JOBSUP_DSN, else DATABASE_URL, else the embedded PostgreSQL.
DATABASES = {"default": database()}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {
    "default": {
        "BACKEND": "jobsup.django.JobsupBackend",
        "QUEUES": ["default", "emails"],  # `jobsup start --queues default,emails` works both
        "OPTIONS": {"max_attempts": 3},
    },
}
