# Two commands on a fresh machine:
#   make demo  - install everything, replay the bundled trace with every policy and print the comparison
#   make test  - install everything, check the layering contract, run every test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || (command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq python3-venv)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(STAMP)
	$(PY) -m loadtest.bench

lint: $(STAMP)
	$(VENV)/bin/lint-imports

test: lint
	$(PY) -m pytest

# Every trace in ../shared/traces (research data, not needed by demo or test).
bench: $(STAMP)
	@for t in ../shared/traces/*/; do echo "== $$t"; $(PY) -m loadtest.bench --trace $$t || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis replay-out
