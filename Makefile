# Every target creates or reuses .venv, so a fresh machine needs nothing but python3 and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py | sha256sum | cut -c1-12)
TRACES ?= ../shared/traces

.PHONY: install browser demo test chaos bench eval lint schemas nats-config clean

$(STAMP): pyproject.toml setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,report]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/rally demo --nodes 4 --gpus-per-node 8 --racks 2

# The suite mostly waits on real servers and processes, so it runs on more workers than cores
# (TEST_WORKERS=1 runs it in one process); a module stays on one worker, which makes its fixtures once.
TEST_WORKERS ?= 4
test: install browser
	$(BIN)/python -m pytest -q -p no:cacheprovider $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

# The dashboard's test drives Debian's Chromium: installed with apt when missing and we may (root, apt-get);
# where it cannot be, tests/e2e/test_dashboard_browser.py skips and says so.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && echo "installing chromium (apt) for the dashboard's browser test" && \
	    { timeout 300 apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { timeout 300 apt-get update -q >/dev/null 2>&1 && timeout 300 apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "note: no Chromium here; the dashboard's browser test will skip (apt-get install -y chromium)"

# A 30-minute seeded chaos run on a local cluster with a summary table (MINUTES=, or STEPS=; SEED=7 reruns one),
# by default on the production shape: three nats-servers (R3) and two replicas of every service
# (NATS_SERVERS=1 REPLICAS=1: one of each); make test runs a short one of each shape (tests/chaos/).
MINUTES ?= 30
NATS_SERVERS ?= 3
REPLICAS ?= 2
chaos: install
	$(BIN)/python -m tests.chaos.monkey $(if $(STEPS),--steps $(STEPS),--minutes $(MINUTES)) $(if $(SEED),--seed $(SEED)) \
		--nats-servers $(NATS_SERVERS) --replicas $(REPLICAS)

bench: install
	$(BIN)/rally bench scheduler --nodes 12500 --gpus-per-node 8 --pending 5000 --json
	$(BIN)/rally bench eventlog --json
	$(BIN)/rally bench dryrun --nodes 12500 --pending 10000 --json
	$(BIN)/rally bench recovery --trials 10 --json
	$(BIN)/rally bench cluster --nodes 500 --json
	$(BIN)/python -m rallypoint.bench.healthbench --nodes 12500
	$(BIN)/python -m rallypoint.bench.simbench --traces $(TRACES) --policy fifo,rallypoint

eval: install
	$(BIN)/python -m rallypoint.sim.evaluate --traces $(TRACES) --out docs/evaluation.md

lint: install
	$(BIN)/ruff check libs services tests
	$(BIN)/ruff format --check libs services tests
	$(BIN)/mypy libs services

schemas: install
	$(BIN)/rally schemas --out schemas

# deploy/nats/accounts.conf and the k8s ConfigMap's accounts.conf, from rallypoint.security.permissions
nats-config: install
	$(BIN)/rally nats config

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .rally
