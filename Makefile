# Everything installs into .venv from nothing but Python: `make test` on a fresh clone is what CI runs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: test demo bench lab clean chaos pgbouncer

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

test: $(VENV)/.installed pgbouncer
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The pooler tests run through a real PgBouncer: installed here when missing and we are root (as on CI);
# otherwise they are skipped, and the summary says why.
pgbouncer:
	@command -v pgbouncer >/dev/null || test -x /usr/sbin/pgbouncer || [ "$$(id -u)" != 0 ] || \
	  ! command -v apt-get >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null; } || \
	  echo "could not install pgbouncer: the pooler tests will be skipped"

# Two minutes of supervisors SIGKILLed, backends terminated and the server restarted (tests/chaos.py).
chaos: $(VENV)/.installed
	$(PY) -m tests.chaos --seconds 120

demo: $(VENV)/.installed
	$(PY) examples/demo.py

lab: $(VENV)/.installed
	$(PY) examples/lab.py

# bench_queue exits 1 while a target is missed; the other two still run.
bench: $(VENV)/.installed
	-$(PY) -m benchmarks.bench_queue
	$(PY) -m benchmarks.bench_supervisor
	$(PY) -m benchmarks.bench_top

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
