# The two commands: `make demo` (a full compression run on the embedded default)
# and `make test`. Both create or update .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export AUTOCOMPRESS_HOME ?= $(CURDIR)/.autocompress
export PREFECT_HOME ?= $(CURDIR)/.autocompress/prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 180
export DO_NOT_TRACK := 1
export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: venv demo test lint bench clean

venv: $(STAMP)

# requirements.lock pins everything resolved together; torch is the CPU build
# where a local wheel exists (see README for CUDA machines).
$(STAMP): pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: venv
	$(VENV)/bin/autocompress demo

test: venv
	$(PY) -m pytest -q -p no:cacheprovider

lint: venv
	$(VENV)/bin/ruff check autocompress tasks flows tests bench

bench: venv
	$(PY) bench/costmodel_validate.py
	$(PY) bench/compare.py

clean:
	rm -rf $(VENV) .autocompress
