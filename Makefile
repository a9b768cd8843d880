# Entry points (see README): `make demo`, `make check` (the fast test tier) and `make test` (the
# whole suite, what CI runs). Each creates .venv with Python 3.12 when it is missing and installs
# the tested set (requirements-dev.txt).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The suite runs on TEST_WORKERS pytest-xdist workers (2: the developer's and CI's cores; 0 runs
# it in this process). --dist loadfile keeps a file's tests on one worker, so a module-scoped
# fixture (a trained checkpoint, the sweep's inputs) is still built once.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile

.PHONY: demo check test venv clean

venv: $(STAMP)

$(STAMP): requirements-dev.txt setup.py
	@set -e; \
	if [ ! -x $(PY) ]; then \
	  PY312=$$(tools/find_python312.sh); \
	  echo "creating $(VENV) with $$PY312"; \
	  "$$PY312" -m venv $(VENV); \
	fi; \
	$(PY) -m pip install -q --upgrade pip; \
	$(PY) -m pip install -q -r requirements-dev.txt; \
	$(PY) -m pip install -q --no-deps -e .; \
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m megatron_endprompt.demo --workdir demo_out

replicate: $(STAMP)
	$(PY) -m benchmarks.replication.mini_replication

# the fast tier: in-process tests only (no `process`, `e2e` or other `slow` test; pytest.ini)
check: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) -m "not slow" tests

test: $(STAMP)
	$(PY) -m pytest -q $(PARALLEL) tests

clean:
	rm -rf demo_out .pytest_cache
