# cosyserve: two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.cosyserve-setup
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: setup setup-browser run test test-unit test-integration test-upstream loadtest bench bench-batching lint clean

setup: $(STAMP)

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

# The playground's browser test drives Debian's chromium with the playwright package (a dev
# extra; never `playwright install`, no browser download). Quick when chromium is already there.
setup-browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	  else \
	    echo "cosyserve: the browser test needs Debian's chromium: sudo apt-get install --no-install-recommends chromium" >&2; \
	    exit 1; \
	  fi; }

run: setup
	$(VENV)/bin/cosyserve serve --config config.yaml --host $(HOST) --port $(PORT)

test: setup setup-browser
	$(PY) -m pytest -q

test-unit: setup
	$(PY) -m pytest -q tests/unit tests/api

test-integration: setup setup-browser
	$(PY) -m pytest -q tests/integration

test-upstream: setup
	COSYSERVE_TEST_UPSTREAM=$(UPSTREAM) $(PY) -m pytest -q -m upstream tests/integration/test_upstream_checkout.py

loadtest: setup
	$(PY) -m bench.loadtest

bench: setup
	$(PY) -m bench.run

# per-request pool vs batched LLM, full-size (built once into .cache/full2) and tiny CosyVoice2; ~20 min
bench-batching: setup
	$(PY) -m bench.batching

lint: setup
	$(VENV)/bin/ruff check app tests bench locustfiles

clean:
	rm -rf $(VENV) .pytest_cache reports
