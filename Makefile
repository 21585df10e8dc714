# cosyserve: two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.cosyserve-setup
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: setup test-deps run test test-unit test-integration test-cluster test-upstream loadtest bench bench-cost bench-abuse bench-priority gpu-check gpu-wheels lint deploy-config clean

setup: $(STAMP) hooks

# the commit convention's hook (CONTRIBUTING.md), only at the top of a git work tree; never fails setup
.PHONY: hooks
hooks:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ -z "$$(git rev-parse --show-prefix)" ]; then \
	  [ "$$(git config core.hooksPath)" = .githooks ] || git config core.hooksPath .githooks \
	    || echo "hooks: could not set core.hooksPath; commits are not checked"; \
	else echo "hooks: not a git work tree, no commit-msg hook"; fi

$(STAMP): pyproject.toml requirements/engine.txt requirements/nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q --no-deps -r requirements/nodeps.txt
	# PyPI torchaudio is CUDA-linked: drop its compiled extensions, the pure-Python parts we use then import.
	rm -f $(VENV)/lib/python3.11/site-packages/torchaudio/lib/*.so
	$(PIP) install -q -r requirements/engine.txt
	$(PIP) install -q -e '.[dev]'
	$(PY) -c "import torch, torchaudio, cosyvoice, matcha, whisper, av, fastapi; print('setup ok: torch', torch.__version__)"
	touch $(STAMP)

# Debian packages the tests need (nginx for tests/cluster, chromium for the playground test), installed if missing.
test-deps:
	bash tests/install-system-deps.sh

run: setup
	$(VENV)/bin/cosyserve serve --config config.yaml --host $(HOST) --port $(PORT)

test: setup test-deps
	$(PY) -m pytest -q

test-unit: setup
	$(PY) -m pytest -q tests/unit tests/api

test-integration: setup test-deps
	$(PY) -m pytest -q tests/integration

# three replicas behind a real nginx: rolling restart, SIGKILL, capacity; prints the figures (~2 min)
test-cluster: setup test-deps
	$(PY) -m pytest -q -s -m cluster tests/cluster

# every mode of v1/v2/v3 on an upstream CosyVoice checkout (adapter + live server), and upstream's own
# example configs over real-dimension weights (the full-size v2 dir: COSYSERVE_FULLSIZE_DIR, else
# .cache/full2, built there if missing); not in CI:
#   git clone --recursive https://github.com/FunAudioLLM/CosyVoice ../CosyVoice && make test-upstream UPSTREAM=../CosyVoice
test-upstream: setup
	COSYSERVE_TEST_UPSTREAM=$(UPSTREAM) $(PY) -m pytest -q -m upstream tests/integration/upstream

loadtest: setup
	$(PY) -m bench serve --scenario loadtest

# the headline suite, admission (3 rounds) and cost; results in .cache/bench/<suite>/ (a curated .md
# goes into docs/benchmarks/: bench/README.md)
bench: setup
	$(PY) -m bench serve --scenario run
	$(PY) -m bench serve --scenario admission --rounds 3
	$(PY) -m bench cost

# what a request costs streamed against whole on the server's defaults, full-size and tiny v2 (~15 min)
bench-cost: setup
	$(PY) -m bench cost

# a polite client alone and beside each adversary (issue 36), one server with the defaults; ~7 min on 2
# idle cores; writes .cache/bench/abuse/ (ABUSE_ARGS: e.g. --phase-s 5 --only dribblers,storm-64)
bench-abuse: setup
	$(PY) -m bench serve --scenario abuse $(ABUSE_ARGS)

# live and bulk on one server (issue 39): the interactive closed loop at the knee alone, beside a backlog of 200
# bulk requests, then the backlog alone; writes .cache/bench/priority/ (PRIORITY_ARGS: e.g. --quick, or
# --model-dir .cache/full2 for the full-size v2)
bench-priority: setup
	$(PY) -m bench serve --scenario priority $(PRIORITY_ARGS)

# The images (docs/deploy.md, "Images"), with docker or podman, whichever is here: cosyserve:VERSION and
# cosyserve-cuda:VERSION. Where python:3.11-slim-bookworm cannot be pulled, a stand-in is built from Debian's
# packages (deploy/images/base-image); where the default package indexes are unreachable, this host's pip
# configuration is passed as a build secret. image-cuda: COSYVOICE=PATH|ARCHIVE|none|auto picks the upstream
# CosyVoice it carries (default: the pinned commit from GitHub).
image:
	deploy/images/build cpu

image-cuda:
	deploy/images/build cuda

# builds both images, runs them as deploy/kubernetes does, removes them (~25 min on 2 cores; in CI)
test-images: setup
	bash tests/images/install-deps.sh
	python3 tests/images/run.py

# the CUDA image's pins (requirements/cuda-constraints.txt), resolved again from PyPI; commit the result
cuda-constraints:
	deploy/images/cuda-constraints

# the Kubernetes base carries a copy of config.yaml (kustomize reads nothing outside it): refresh it after an edit
deploy-config:
	cp config.yaml deploy/kubernetes/base/config.yaml

# The GPU check (docs/gpu.md), on a CUDA machine whose python3 has torch: builds the full-size random-weight v2
# dir and writes .cache/bench/gpu_check/gpu.{md,json} in at most 8 minutes (docs/benchmarks/ takes the .md only).
# Wheels from `make gpu-wheels` in .whl/ (no network needed there) are installed into $(GPU_SITE) first.
# On a CPU: make gpu-check GPU_CHECK_ARGS="--device cpu --quick" (writes .cache/bench/gpu_check/cpu.*)
GPU_PYTHON     ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_SITE       ?= .cache/gpu-site
GPU_CHECK_ARGS ?=
gpu-check:
	@if ! PYTHONPATH=$(GPU_SITE) $(GPU_PYTHON) -c "import cosyvoice, hyperpyyaml" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then \
	  $(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --upgrade --target $(GPU_SITE) .whl/*.whl; fi
	PYTHONPATH=$(GPU_SITE):$$PYTHONPATH PYTORCH_CUDA_ALLOC_CONF=$${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} \
	  $(GPU_PYTHON) -m bench gpu $(GPU_CHECK_ARGS)

# the wheels a GPU machine without network needs for gpu-check (Python 3.12), into .whl/; prints their size
gpu-wheels: setup
	$(PY) -m tools.gpu_wheels

lint: setup
	$(VENV)/bin/ruff check app tests bench locustfiles tools

clean:
	rm -rf $(VENV) .pytest_cache reports
