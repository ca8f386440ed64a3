"""Django settings of benchmarks/bench_django.py: the database is the benchmark's (JOBSUP_DSN)."""

import django

from jobsup.django import database

SECRET_KEY = "jobsup-bench"
USE_TZ = True
INSTALLED_APPS = ["django_tasks"] if django.VERSION < (6, 0) else []
DATABASES = {"default": database()}
TASKS = {"default": {"BACKEND": "jobsup.django.JobsupBackend"}}
