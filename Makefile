# Two commands on a fresh machine:
#   make demo  - install everything, replay the bundled trace with every policy and print the comparison
#   make test  - install everything (Python packages, Debian's prometheus and nginx, the Kubernetes test
#                binaries built from Go modules when missing), check the layering contract, run every test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SYSTEM_STAMP := $(VENV)/.system
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test bench bench-controller lint clean system kube proto

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || (command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq python3-venv)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(STAMP)
	$(PY) -m loadtest.bench

# Real servers the integration tests start: Prometheus and nginx from Debian.
$(SYSTEM_STAMP): $(STAMP)
	@command -v prometheus >/dev/null && command -v nginx >/dev/null || \
	  ($(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus nginx)
	touch $@

system: $(SYSTEM_STAMP)

# kube-apiserver, etcd, kube-scheduler, kube-controller-manager and kwok, cached outside the repository.
kube:
	@loadtest/kube/build.sh

lint: $(STAMP)
	$(VENV)/bin/lint-imports

test: lint system kube
	$(PY) -m pytest

# Every trace in ../shared/traces (research data, not needed by demo or test).
bench: $(STAMP)
	@for t in ../shared/traces/*/; do echo "== $$t"; $(PY) -m loadtest.bench --trace $$t || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis replay-out

# Regenerate the KEDA gRPC stubs after editing the proto.
proto: $(STAMP)
	cd autoscaler/external_scaler && ../../$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. externalscaler.proto
	sed -i 's/^import externalscaler_pb2 as/from autoscaler.external_scaler import externalscaler_pb2 as/' autoscaler/external_scaler/externalscaler_pb2_grpc.py

# Runtime figures of the live controller (loop overhead, KEDA latency, memory); needs `make system`.
bench-controller: $(SYSTEM_STAMP)
	$(PY) -m loadtest.controller_bench
