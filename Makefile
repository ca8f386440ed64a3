# Everything installs into .venv from nothing but Python: `make test` on a fresh clone is what CI runs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: test test-fast check docs demo bench lab clean demo-django test-django6 test-django-oldest chaos pgbouncer schema chromium web-screenshots

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,check,docs]'
	touch $@

test: $(VENV)/.installed pgbouncer chromium
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The tests not marked `slow` (those start no supervisor or other long-running process and take under
# about a second each): a minute or less. pytest says how many it left out ("N deselected").
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# What CI checks beside the tests: lint, format, types, the import contracts between the layers, the docs.
check: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir build/site

# jobsup/db/schema.sql: the schema a fresh `jobsup migrate` makes, read back from the catalogs (on an
# embedded server of its own, or JOBSUP_TEST_DSN); tests/test_schema_file.py fails while it is stale.
schema: $(VENV)/.installed
	$(PY) -m tests.schema_file

docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site
	@echo "the site is in build/site (make docs-serve serves it at http://127.0.0.1:8000)"

docs-serve: $(VENV)/.installed
	$(VENV)/bin/mkdocs serve

# The pooler tests run through a real PgBouncer: installed here when missing and we are root (as on CI);
# otherwise they are skipped, and the summary says why.
pgbouncer:
	@command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer || [ "$$(id -u)" != 0 ] || \
	  ! command -v apt-get >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null; } || \
	  echo "could not install pgbouncer: the pooler tests will be skipped"

# The web console's browser tests drive Debian's chromium (through Playwright, which never downloads a
# browser of its own here): installed when missing and we are root (as on CI). Without it those tests
# fail rather than skip, so a CI that cannot install it says so.
chromium:
	@command -v chromium >/dev/null || test -x /usr/bin/chromium || [ "$$(id -u)" != 0 ] || \
	  ! command -v apt-get >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "could not install chromium: the web console's browser tests will fail"

# Screenshots of the web console's main views at 1280x800 into docs/images/web/, taken by the browser the
# tests drive, on a demo queue of the embedded kind in a scratch database.
web-screenshots: $(VENV)/.installed chromium
	$(PY) docs/gen_web_screenshots.py

# Two minutes of supervisors SIGKILLed, backends terminated and the server restarted (tests/chaos.py).
chaos: $(VENV)/.installed
	$(PY) -m tests.chaos --seconds 120

demo: $(VENV)/.installed
	$(PY) examples/demo.py

# The example Django project (examples/django_project) run by `jobsup start --django` on the embedded database.
demo-django: $(VENV)/.installed
	$(PY) examples/django_project/demo.py

# tests/test_django.py on Django 6 (django.tasks), in a venv of its own: Django 6 needs Python 3.12+.
PYTHON312 ?= $(shell for p in python3.14 python3.13 python3.12; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null \
	&& { command -v $$p; break; }; done; \
	for d in $$HOME/.pyenv/versions/3.1[2-9]*/bin; do [ -x $$d/python3 ] && { echo $$d/python3; break; }; done)
VENV6 := .venv-django6
$(VENV6)/.installed: pyproject.toml
	@if [ -z "$(firstword $(PYTHON312))" ]; then \
		echo "test-django6: Django 6 needs Python 3.12 or newer, and none was found (set PYTHON312=/path/to/python3.12)" >&2; \
		exit 1; fi
	$(firstword $(PYTHON312)) -m venv $(VENV6)
	$(VENV6)/bin/python -m pip install --quiet --upgrade pip
	$(VENV6)/bin/python -m pip install --quiet -e '.[django]' pytest pytest-timeout 'django>=6.0,<7'
	touch $@

test-django6: $(VENV6)/.installed
	$(VENV6)/bin/python -m pytest -q tests/test_django.py $(PYTEST_ARGS)

# tests/test_django.py on the oldest django-tasks that pyproject.toml allows (its floor), in a venv of its
# own: older releases lack names jobsup.django imports (0.8: TaskResultStatus; 0.9-0.11: SUCCESSFUL).
DJANGO_TASKS_OLDEST := 0.12.0
VENV_OLDEST := .venv-django-oldest
$(VENV_OLDEST)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_OLDEST)/bin/python -m pip install --quiet -e '.[django]' pytest pytest-timeout 'django-tasks==$(DJANGO_TASKS_OLDEST)'
	touch $@

test-django-oldest: $(VENV_OLDEST)/.installed
	$(VENV_OLDEST)/bin/python -c 'import django_tasks, importlib.metadata as m; 		v = m.version("django-tasks"); assert v == "$(DJANGO_TASKS_OLDEST)", v; print("django-tasks", v)'
	$(VENV_OLDEST)/bin/python -m pytest -q tests/test_django.py $(PYTEST_ARGS)

lab: $(VENV)/.installed
	$(PY) examples/lab.py

# bench_queue and bench_soak exit 1 while a target is missed; the others still run. The soak runs
# 3 minutes here; `-m benchmarks.bench_soak` alone runs the 10 minutes the README's figures come from.
SOAK ?= 3m
bench: $(VENV)/.installed
	-$(PY) -m benchmarks.bench_queue
	$(PY) -m benchmarks.bench_supervisor
	$(PY) -m benchmarks.bench_top
	$(PY) -m benchmarks.bench_doctor
	$(PY) -m benchmarks.bench_cron
	-$(PY) -m benchmarks.bench_soak --duration $(SOAK)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
