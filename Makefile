# Every target bootstraps .venv (and reinstalls when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test check lint bench bench-guard stress clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)  ## three waves of jobs at mixed priorities, strict order on one worker, CPU speed-up, durable and recurring jobs
	$(PY) -m mpsched demo
	$(PY) examples/strict_order.py
	$(PY) examples/cpu_speedup.py
	$(PY) examples/durable_jobs.py
	$(PY) examples/recurring.py

bench: $(STAMP)  ## side by side with the peers; rewrites benchmarks/README.md
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/run.py

bench-guard: $(STAMP)  ## throughput vs ProcessPoolExecutor, lateness vs sched: ~1 min, exits 1 on a miss
	$(PY) benchmarks/guard.py

stress: $(STAMP)
	$(PY) -m mpsched stress --producers 3 --workers 4 --jobs 20000

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check mpsched tests examples
	$(PY) -m mypy

check: lint test

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
