# Two commands on a fresh machine:
#   make demo  - install everything, replay the bundled trace with every policy and print the comparison
#   make test  - install everything (Python packages, Debian's prometheus and nginx, the Kubernetes test
#                binaries built from Go modules when missing), check the layering contract, run every test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SYSTEM_STAMP := $(VENV)/.system
# pip shows its progress when make runs on a terminal (stderr; stdout is captured where the shell decides)
# and CI is unset, else stays quiet; `make PIP_QUIET=--quiet` or `make PIP_QUIET=` forces either.
PIP_QUIET = $$([ -t 2 ] && [ -z "$$CI" ] || echo --quiet)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: pip-flags demo test e2e bench bench-controller lint lock clean system kube proto image

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || (command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq python3-venv)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_QUIET) --upgrade pip
	$(PY) -m pip install $(PIP_QUIET) -c constraints.txt -e '.[replay,test]'
	touch $@

demo: $(STAMP)
	$(PY) -m loadtest.bench

# Real servers the integration tests start: Prometheus and nginx from Debian; headless Chromium for the
# analyze report; podman, runc and mmdebstrap
# to build and run the container image.
SYSTEM_PACKAGES := prometheus nginx podman runc mmdebstrap chromium
$(SYSTEM_STAMP): $(STAMP)
	@for cmd in $(SYSTEM_PACKAGES); do command -v $$cmd >/dev/null || missing=1; done; \
	  [ -z "$$missing" ] || ($(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $(SUDO) apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES))
	touch $@

system: $(SYSTEM_STAMP)

# kube-apiserver, etcd, kube-scheduler, kube-controller-manager, kwok, kustomize, Karpenter's kwok provider and
# KEDA, built from Go modules and cached outside the repository (minutes, once).
kube:
	@loadtest/kube/build.sh

# The controller's container image, built with podman (loadtest/image/build.sh explains the offline base).
image: system
	@loadtest/image/build.sh

# Import contracts (layers, no cycles), ruff (lint only), mypy (strict on policies/); settings in pyproject.toml.
lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/mypy

test: lint system kube
	$(PY) -m pytest

# Every closed-loop scenario (`make test` runs the doubling drill only): figures, checks and PNGs in e2e-out/.
e2e: lint system kube
	$(PY) -m loadtest.e2e --scenario all --out e2e-out

# Every trace in ../shared/traces (research data, not needed by demo or test).
bench: $(STAMP)
	@for t in ../shared/traces/*/; do echo "== $$t"; $(PY) -m loadtest.bench --trace $$t || exit 1; done

# Regenerate constraints.txt from a fresh environment (after changing dependencies in pyproject.toml).
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv && .lock-venv/bin/pip install --quiet '.[replay,test]'
	(sed -n '1,2p' constraints.txt; .lock-venv/bin/pip freeze --exclude-editable | grep -v '^inference-autoscaler') > constraints.new
	mv constraints.new constraints.txt && rm -rf .lock-venv

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache replay-out e2e-out

# Regenerate the KEDA gRPC stubs after editing the proto.
proto: $(STAMP)
	cd autoscaler/external_scaler && ../../$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. externalscaler.proto
	sed -i 's/^import externalscaler_pb2 as/from autoscaler.external_scaler import externalscaler_pb2 as/' autoscaler/external_scaler/externalscaler_pb2_grpc.py

# Runtime figures of the live controller (loop overhead, KEDA latency, memory); needs `make system`.
bench-controller: $(SYSTEM_STAMP)
	$(PY) -m loadtest.controller_bench
	$(PY) -m loadtest.controller_bench --targets 1,50,500

# The pip flags the install uses from this terminal (or pipe), for the tests.
pip-flags:
	@echo "pip install $(PIP_QUIET)"
