# raypulse: `make demo` runs the main job end to end, `make test` runs the tests.
# Both set up everything on a fresh machine (a virtualenv in .venv, and the Prometheus tools).

VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
# Each command the tests need and the Debian package it comes from (COMMAND:PACKAGE).
SYSTEM_DEPS := prometheus:prometheus promtool:prometheus prometheus-alertmanager:prometheus-alertmanager \
	amtool:prometheus-alertmanager prometheus-node-exporter:prometheus-node-exporter chromium:chromium

.PHONY: install system-deps demo test test-quick lint bench bench-launch bench-footprint bench-progress bench-selection bench-scale bench-fleet bench-week docs dashboards \
	alerts drill rl-drill heal-drill heal-soak release-check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Real Prometheus, promtool, Alertmanager and node_exporter for the tests and the benchmark; Debian's
# chromium (headless) for the run report's browser test. Only the packages of missing commands: Ubuntu has
# no chromium package (a snap), and GitHub's Ubuntu runners bring their own /usr/bin/chromium.
system-deps:
	@packages=""; for dep in $(SYSTEM_DEPS); do \
		command -v $${dep%%:*} >/dev/null 2>&1 || case " $$packages " in *" $${dep#*:} "*) ;; *) packages="$$packages $${dep#*:}";; esac; \
	done; \
	if [ -n "$$packages" ]; then \
		echo "installing$$packages"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$packages; \
	fi

# The main job: `launcher submit` of examples/train.py on a local Ray cluster with simulated GPUs,
# its progress and metrics, Prometheus with the alert rules; leaves nothing running. Ray runs are
# serialized with the tests and benchmarks on this machine by the same lock.
demo: install system-deps
	flock /tmp/raypulse-ray.lock $(PY) -m scripts.demo $(ARGS)

# The tests marked ray or online one after another, the rest beside them in namespaces of their own
# (PID, mount, network: they never see the Ray clusters; scripts/test_lanes.py). Ends with the 20 slowest tests.
test: install system-deps lint
	$(PY) -m scripts.test_lanes

# The quick lane (about 4 minutes on 2 cores): everything but the tests that start Ray or a whole Prometheus
# stack, on two workers (a file's tests on one).
test-quick: install system-deps lint
	$(PY) -m pytest -n 2 --dist loadfile -m "not ray and not slow"

lint: install
	$(VENV)/bin/ruff check .

bench: install system-deps
	$(PY) -m bench.scrape

# Footprint with 8 simulated GPUs (RSS, scrape p50/p99 at one client, idle CPU, the simulator's share
# apart) beside node_exporter: docs/benchmarks.md.
bench-footprint: install system-deps
	$(PY) -m bench.footprint

# Launch time: `launcher submit` to RUNNING on head + 2 workers against the same steps by hand.
bench-launch: install
	flock /tmp/raypulse-ray.lock $(PY) -m bench.launch

# The progress client's cost per call (report, phase, report_iteration) against a bare loop, with an
# exporter and with none listening: docs/benchmarks.md.
bench-progress: install
	$(PY) -m bench.progress_client

# Reading a few families (`/metrics?name[]=...`, 304s) against the whole /metrics: docs/benchmarks.md.
bench-selection: install system-deps
	$(PY) -m bench.selection

# raypulse at cluster scale (issue 26), beside a named commit's code: docs/scale.md. SCALE_BASE_REF is the
# last release tag or, while there is none, d7c1984 (the code before issue 26: docs/scale.md's baseline
# columns); SCALE_BASE_REF=<commit> for another. Never HEAD: committed, that is the code under test.
SCALE_BASE_REF ?= $(shell git describe --tags --abbrev=0 2>/dev/null || echo d7c19846b99ae53c94affb36003aff9871974dcb)
SCALE_BASE ?= /tmp/raypulse-scale-base
bench-scale: install
	@git rev-parse --verify --quiet '$(SCALE_BASE_REF)^{commit}' >/dev/null || { echo "bench-scale: \
	SCALE_BASE_REF=$(SCALE_BASE_REF) is not a commit of this clone (a shallow one? git fetch --unshallow); \
	pass SCALE_BASE_REF=<commit>" >&2; exit 2; }
	rm -rf $(SCALE_BASE) && mkdir -p $(SCALE_BASE) && git archive '$(SCALE_BASE_REF)' | tar -x -C $(SCALE_BASE)
	$(PY) -m bench.scale --section launcher --sizes 10,100,500,2000 --baseline $(SCALE_BASE)
	$(PY) -m bench.scale --section prometheus --sizes 50,200,400

# The fleet watch at 2,000 and 10,000 nodes: the head's document beside direct reads (docs/scale.md).
bench-fleet: install
	$(PY) -m bench.fleet_watch --sizes 2000,10000

# A week of a run (issue 37): the record at 100 and 2,000 nodes, and the launcher's RSS over 60,480 health
# checks at 100 nodes (docs/scale.md).
bench-week: install
	$(PY) -m bench.long_run --nodes 100,2000
	$(PY) -m bench.launcher_week --nodes 100

docs: install
	$(VENV)/bin/exporter metrics -o markdown --out docs/metrics.md
	$(VENV)/bin/exporter config-reference --out docs/configuration.md

# Grafana dashboards: dashboards/json/*.json, dashboards/provisioning/ and docs/dashboards.md from dashboards/boards/.
dashboards: install
	$(PY) -m dashboards.build
	$(VENV)/bin/launcher exporters manifests --kustomize exporter/kustomize  # the kustomize base carries the dashboards

# Alert rules: alerts/rules/*.yaml and docs/alerts.md from alerts/groups/ and alerts/config.py.
alerts: install
	$(PY) -m alerts.build
	$(VENV)/bin/launcher exporters manifests --kustomize exporter/kustomize  # the kustomize base carries the rules

# The alert fault drill (a real Ray cluster, Prometheus, Alertmanager): writes docs/alerts-drill.md.
drill: install system-deps
	flock /tmp/raypulse-ray.lock $(PY) -m scripts.drill --output docs/alerts-drill.md

# The RL drill (RLlib's PPO on a real Ray cluster, every RL fault, the RL board): writes docs/rl-drill.md.
rl-drill: install system-deps
	flock /tmp/raypulse-ray.lock $(PY) -m scripts.rl_drill --output docs/rl-drill.md

# The healing drill (real Ray clusters, one fault each): writes docs/healing-drill.md.
heal-drill: install system-deps
	flock /tmp/raypulse-ray.lock $(PY) -m scripts.heal_drill --output docs/healing-drill.md

# The healing soak (issue 38): two 40-minute runs of examples/train.py, a fault every 10 minutes, the first
# checkpointing every 30 s, the second at the interval the first one's advice gave; their effective training
# time ratios and the launcher's own accounts side by side in the Soak section of docs/healing-drill.md.
# ARGS go to both runs (e.g. ARGS="--minutes 5 --fault-every 60"); the runs are kept under SOAK_DIR.
SOAK_DIR ?= /tmp/raypulse-heal-soak
heal-soak: install system-deps
	rm -rf $(SOAK_DIR)/every-30 $(SOAK_DIR)/advised && mkdir -p $(SOAK_DIR)
	flock /tmp/raypulse-ray.lock $(PY) -m scripts.heal_drill.soak --checkpoint-seconds 30 \
		--workdir $(SOAK_DIR)/every-30 --json $(SOAK_DIR)/every-30.json $(ARGS)
	flock /tmp/raypulse-ray.lock $(PY) -m scripts.heal_drill.soak --advised-from $(SOAK_DIR)/every-30.json \
		--workdir $(SOAK_DIR)/advised --json $(SOAK_DIR)/advised.json $(ARGS)
	$(PY) -m scripts.heal_drill.soak --from-json $(SOAK_DIR)/every-30.json $(SOAK_DIR)/advised.json \
		--output docs/healing-drill.md

# What the release workflow (.github/workflows/release.yml) does, short of publishing: sdist and wheel
# built into a temporary directory, `twine check`, the workflow against its schema, and the version, the
# tag filter and the image name agreeing (scripts/release_check.py).
release-check: install
	$(PY) -m scripts.release_check

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .demo
