# The two commands: `make run` (install + start the product) and `make test` (install + run every test).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install run test services-stop lint

install:
	@bash scripts/install.sh

run: install
	$(PY) manage.py up

test: install
	$(PY) manage.py prepare_models
	$(PY) -m trainer.envs.swe.build --sources-only
	$(PY) -m pytest

services-stop:
	$(PY) manage.py services stop

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
