# STACX: two commands for a fresh machine.
#   make demo   installs everything, starts the local services the quickstart needs, runs it
#   make test   installs everything, starts the services, runs the whole test suite
# Both are idempotent and fast once everything is installed.

VENV := .venv
STACX := $(VENV)/bin/stacx
PYTEST_ARGS ?=

.PHONY: setup services demo test test-unit lint down status bench mutation

setup:
	@bash infra/setup.sh

services: setup
	@$(STACX) infra up

demo: setup
	@$(STACX) infra up --no-trace-backend --no-browser
	@$(STACX) quickstart

test: services
	@$(VENV)/bin/pytest tests $(PYTEST_ARGS)

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
mutation: setup
	@nice $(VENV)/bin/mutmut run --max-children $${MUTATION_JOBS:-2}
	@$(VENV)/bin/mutmut results
