# Statefleet: `make demo` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
export KUBECONFIG ?= $(CURDIR)/.testbed/kubeconfig
# When make started: `make test` prints its time against its budget at the end.
STARTED := $(shell date +%s)
# Parallel e2e workers, each with its own operator and namespaces (chosen by measurement on
# this 2-core machine: docs/testing.md).
E2E_WORKERS ?= 2

# Debian packages the test bed and the tests need.
DEBIAN_PACKAGES := containerd runc containernetworking-plugins debootstrap iptables conntrack \
	iproute2 openssl curl ca-certificates gcc libc6-dev python3-venv postgresql-client shellcheck zstd ipset \
	maven openjdk-17-jdk-headless nodejs

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: deps
deps: debian-packages $(VENV)/.installed ## install what the project needs (Debian packages, Python venv)

.PHONY: debian-packages
debian-packages:
	@missing=$$(dpkg-query -W -f='$${Package} $${Status}\n' $(DEBIAN_PACKAGES) 2>/dev/null | grep -v ' installed$$' | cut -d' ' -f1; \
	  for p in $(DEBIAN_PACKAGES); do dpkg-query -W $$p >/dev/null 2>&1 || echo $$p; done); \
	missing=$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' '); \
	if [ -n "$${missing// }" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@# npm: Debian's, unless the Node.js installed brings its own.
	@command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null; }

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

.PHONY: testbed-up
testbed-up: deps ## start the local Kubernetes test bed (builds what is missing)
	testbed/up.sh

.PHONY: testbed-down
testbed-down: ## stop the test bed and remove everything it made on the host
	testbed/down.sh

.PHONY: demo
demo: testbed-up ## bring the test bed up and run the demo
	$(PY) -m e2e.demo

.PHONY: lint
lint: deps ## ruff check and format check, shellcheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	shellcheck -x -S warning testbed/*.sh testbed/images/build.sh testbed/images/*/rootfs/usr/local/bin/*.sh \
	  e2e/apps/*/build.sh .ci/run

.PHONY: unit
unit: deps ## unit tests (no cluster)
	$(PY) -m pytest -m unit

.PHONY: controller
controller: testbed-up ## the controller tier alone: the operator in-process against the test bed's API, no pods
	STATEFLEET_TIER=controller $(PY) -m pytest -m controller

# Every test but those that change the whole cluster runs in parallel workers (the controller
# tier among them); then those, alone; then where the time went, against the budget.
.PHONY: e2e
e2e: testbed-up ## controller tier, integration and e2e tests on the test bed, in parallel workers
	rm -f .testbed/logs/e2e-timing-*.json
	@status=0; \
	STATEFLEET_TIER=e2e $(PY) -m pytest -m '(controller or integration or e2e) and not serial' \
	  -n $(E2E_WORKERS) --dist loadgroup --timeout 1800 || status=1; \
	STATEFLEET_TIER=serial $(PY) -m pytest -m 'e2e and serial' --timeout 1800 || status=1; \
	$(PY) -m e2e.timing $(if $(filter test,$(MAKECMDGOALS)),--make-test-started $(STARTED)); \
	exit $$status

.PHONY: test
test: lint unit e2e ## every test: lint, unit, then integration and e2e on the test bed

.PHONY: bench
bench: testbed-up ## benchmarks (figures and ratios against a baseline measured in the same run)
	@# The WAL archiving and restore benchmarks run a PostgreSQL server of the host's (Debian's package).
	@dpkg-query -W postgresql pgbackrest >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql pgbackrest >/dev/null)
	$(PY) -m e2e.bench.postgres_fleet --count 200 --rss-count 500
	$(PY) -m e2e.bench.rollout_fleet --replicas 1000 --native-replicas 20 --delay 5
	$(PY) -m e2e.bench.wal_archive --wal-mb 1024 --repeats 3
	$(PY) -m e2e.bench.wal_restore --wal-mb 1024 --repeats 3 --local
	$(PY) -m e2e.bench.base_backup --size-mb 1024 --repeats 3
	$(PY) -m e2e.bench.base_backup --size-mb 1024 --repeats 3 --pitr-wal-mb 2048
