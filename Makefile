# STACX: two commands for a fresh machine.
#   make demo   installs everything, starts the local services the quickstart needs, runs it
#   make test   installs everything, starts the services, runs the whole test suite
# Both are idempotent and fast once everything is installed.

VENV := .venv
STACX := $(VENV)/bin/stacx
PYTEST_ARGS ?=

.PHONY: setup services demo test test-unit test-swebench lint down status bench mutation

setup:
	@bash infra/setup.sh

services: setup
	@$(STACX) infra up

demo: setup
	@$(STACX) infra up --no-trace-backend --no-browser
	@$(STACX) quickstart

test: services
	@$(VENV)/bin/pytest tests $(PYTEST_ARGS)

# real SWE-bench Verified instances built here (needs git copies of their repositories, which no
# registry carries): STACX_SWEBENCH_REPOS=/path/to/copies make test-swebench
test-swebench: services
	@test -d "$$STACX_SWEBENCH_REPOS" || { echo "make test-swebench: set STACX_SWEBENCH_REPOS to a folder of git copies (owner+name/)"; exit 2; }
	@$(VENV)/bin/pytest tests/swebench $(PYTEST_ARGS)

test-unit: setup
	@$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

lint: setup
	@$(VENV)/bin/ruff check schemas producers consumers rollout sandbox trainer infra tests bench
	@$(VENV)/bin/mypy

status: setup
	@$(STACX) infra status

down: setup
	@$(STACX) infra down

# mutation testing of the critical modules ([tool.mutmut] in pyproject.toml); CPU-heavy
# (one OpenMP thread: mutmut forks its runs from a process that imported torch, and a forked
# OpenMP pool deadlocks, which mutmut would count as a timeout, that is as a detected mutant)
# (mutmut 3.7 reads a pytest item attribute that pytest 9.2 removed: refuse that pair in one line)
mutation: setup
	@$(VENV)/bin/python -c 'import sys, importlib.metadata as m; v = lambda n: tuple(int(x) for x in m.version(n).split(".")[:2]); sys.exit(v("mutmut") < (3, 8) and v("pytest") >= (9, 2))' \
	  || { echo "make mutation: mutmut $$($(VENV)/bin/python -c 'import importlib.metadata as m; print(m.version("mutmut"))') cannot drive pytest >= 9.2 ('Function' object has no attribute '_nodeid'): install pytest < 9.2 in the environment"; exit 2; }
	@OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice $(VENV)/bin/mutmut run --max-children $${MUTATION_JOBS:-2} $(MUTANTS)
	@$(VENV)/bin/python bench/mutation_score.py
