# Everything installs into .venv from nothing but Python: `make test` on a fresh clone is what CI runs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: test demo bench lab clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: $(VENV)/.installed
	$(PY) examples/demo.py

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
