# Every target bootstraps .venv (and reinstalls when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test check lint bench bench-guard stress clean tools screenshot

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

bench-guard: $(STAMP)  ## throughput and 2 ms efficiency vs ProcessPoolExecutor, lateness vs sched: ~1.5 min, exits 1 on a miss
	$(PY) benchmarks/guard.py

stress: $(STAMP)
	$(PY) -m mpsched stress --producers 3 --workers 4 --jobs 20000

# Programs the tests start themselves (each Redis test runs a redis-server of its own,
# never the system's; the status page's tests drive Debian's chromium, never a browser
# Playwright downloads). As root on Debian, what is missing is installed; else we say what
# to do.
SYSTEM_TOOLS := redis-server chromium

tools:
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

test: $(STAMP) tools
	$(PY) -m pytest

# docs/dashboard.png, the README's picture of the status page: taken by the page's browser
# test, from a copy of this tree in a temporary directory, so that the tracebacks on it name
# no one's checkout.
screenshot: $(STAMP) tools
	@copy=$$(mktemp -d) && mkdir $$copy/mpsched && git ls-files -z | \
	  xargs -0 cp --parents -t $$copy/mpsched && cd $$copy/mpsched && \
	  MPSCHED_SCREENSHOT=$(CURDIR)/docs/dashboard.png PYTHONPATH=$$copy/mpsched \
	  $(CURDIR)/$(PY) -m pytest -q -p no:cacheprovider tests/test_dashboard_page.py \
	  -k follows_a_job; status=$$?; rm -rf $$copy; exit $$status

lint: $(STAMP)
	$(PY) -m ruff check mpsched tests examples
	$(PY) -m mypy

check: lint test

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
