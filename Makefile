# Every target bootstraps .venv (and reinstalls when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: help demo test test-fast docs check lint format bench bench-guard stress clean tools screenshot

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /\1\t/' | \
	  awk -F'\t' '{ printf "  make %-12s %s\n", $$1, $$2 }'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)  ## three waves of jobs at mixed priorities, strict order on one worker, CPU speed-up, durable, recurring and retried jobs, a pipeline
	$(PY) -m mpsched demo
	$(PY) examples/strict_order.py
	$(PY) examples/cpu_speedup.py
	$(PY) examples/durable_jobs.py
	$(PY) examples/recurring.py
	$(PY) examples/retries.py
	$(PY) examples/pipeline.py

bench: $(STAMP)  ## side by side with the peers; rewrites benchmarks/README.md
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) benchmarks/run.py

bench-guard: $(STAMP)  ## throughput and 2 ms efficiency vs ProcessPoolExecutor, lateness vs sched: ~1.5 min, exits 1 on a miss
	$(PY) benchmarks/guard.py

stress: $(STAMP)  ## flood a manager with 20,000 jobs from 3 producers and check each ran once
	$(PY) -m mpsched stress --producers 3 --workers 4 --jobs 20000

# Programs the tests start themselves (each Redis test runs a redis-server of its own,
# never the system's; the status page's tests drive Debian's chromium, never a browser
# Playwright downloads). As root on Debian, what is missing is installed; else we say what
# to do. Only this target installs system packages: run it once before make test.
SYSTEM_TOOLS := redis-server chromium

tools:  ## install the programs the tests start (redis-server, chromium) with apt-get, if missing
	@for tool in $(SYSTEM_TOOLS); do \
	  command -v $$tool >/dev/null && continue; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $$tool (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$tool >/dev/null \
	      || exit 1; \
	  else \
	    echo "the tests need $$tool: install it (Debian: apt-get install $$tool)" >&2; exit 1; \
	  fi; \
	done

test: $(STAMP)  ## the whole test suite, in 2 processes (~9 min on 2 cores); needs make tools once
	$(PY) -m pytest -n 2

test-fast: $(STAMP)  ## the tests not marked slow (under 2 min)
	$(PY) -m pytest -m "not slow"

docs: $(STAMP)  ## build the documentation site into site/; fails on a broken link or reference
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# docs/dashboard.png, the README's picture of the status page: taken by the page's browser
# test, from a copy of this tree in a temporary directory, so that the tracebacks on it name
# no one's checkout.
screenshot: $(STAMP)  ## take docs/dashboard.png again (needs make tools once)
	@copy=$$(mktemp -d) && mkdir $$copy/mpsched && git ls-files -z | \
	  xargs -0 cp --parents -t $$copy/mpsched && cd $$copy/mpsched && \
	  MPSCHED_SCREENSHOT=$(CURDIR)/docs/dashboard.png PYTHONPATH=$$copy/mpsched \
	  $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider tests/test_dashboard_page.py \
	  -k follows_a_job; status=$$?; rm -rf $$copy; exit $$status

format: $(STAMP)  ## ruff format and ruff's import order on every Python file (the rules pyproject.toml sets)
	$(PY) -m ruff format .
	$(PY) -m ruff check --select I --fix --quiet .

lint: $(STAMP)  ## ruff's checks (also benchmarks/) and format check, and mypy: strict on mpsched/, every function body in tests/, examples/ and benchmarks/
	$(PY) -m ruff check mpsched tests examples docs/_hooks benchmarks
	$(PY) -m ruff format --check --quiet .
	$(PY) -m mypy

check: lint test  ## lint, then the whole test suite

clean:  ## remove .venv, site/ and the caches
	rm -rf $(VENV) site build *.egg-info .pytest_cache .mypy_cache .ruff_cache
