# raypulse: `make demo` runs the main job end to end, `make test` runs the tests.
# Both set up everything on a fresh machine (a virtualenv in .venv, and the Prometheus tools).

VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
APT_PACKAGES := prometheus prometheus-alertmanager prometheus-node-exporter

.PHONY: install system-deps demo test lint bench docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Real Prometheus, promtool, Alertmanager and node_exporter for the tests and the benchmark.
system-deps:
	@missing=""; for bin in prometheus promtool prometheus-alertmanager amtool prometheus-node-exporter; do \
		command -v $$bin >/dev/null 2>&1 || missing="$$missing $$bin"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing $(APT_PACKAGES) (missing:$$missing)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PACKAGES); \
	fi

demo: install
	$(PY) scripts/demo.py

test: install system-deps lint
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .

bench: install system-deps
	$(PY) bench/scrape.py

docs: install
	$(VENV)/bin/exporter metrics --format markdown --output docs/metrics.md
	$(VENV)/bin/exporter config-reference --output docs/configuration.md

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .demo
