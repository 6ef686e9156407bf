# Wolfpack: the two commands a newcomer needs are `make demo` and `make test`; both set up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.wolfpack-setup

.PHONY: setup chromium demo test lint typecheck proto proto-check bench clean up mutate

setup: $(STAMP) chromium

# The browser tests of `wolfpack web` drive Debian's chromium through Playwright (its own browser download
# is unreachable here); installed once, as root, when missing.
chromium:
	@test -x /usr/bin/chromium || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
		|| echo "warning: /usr/bin/chromium is missing (apt-get install chromium); the web browser tests will fail"

# Re-run pip only when the dependency list changed. torch (inference/trainer extras) is installed with
# an exact pin first so pip never resolves a multi-GB CUDA build on CPU machines. --no-compile: pip would
# byte-compile all ~23k files of the environment (~90 s of one core here; ray, transformers' model zoo,
# wandb, sympy...), most of which nothing imports; Python compiles what is imported, once, on first use
# (where PYTHONDONTWRITEBYTECODE is set, on every use: `make test` unsets it for its run).
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile "torch==2.13.0"
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev,environment,inference,trainer,web]"
	@touch $(STAMP)

# The training job resumes its run directory: a rerun continues, or (finished) prints the summary and
# the `learning:` line again; `make demo DEMO_ARGS=--fresh` starts over.
demo: setup
	$(BIN)/wolfpack up --check --base-port 0 --timeout 600  # first run may fetch and convert SmolLM2
	$(BIN)/wolfpack play werewolf --players 9 --seed 7 --bots heuristic
	$(BIN)/wolfpack train --config configs/demo-ultimatum-local.yaml $(DEMO_ARGS)  # ends with the `learning:` line
# The same task through the services (rollout -> environment/inference/reward -> stream -> PushWeights) is
# configs/demo-ultimatum.yaml (same prompts; its learning line clears every constant too, configs/README.md),
# a few minutes longer: the demo runs the in-process one (the same rollout driver over in-process backends).

up: setup
	$(BIN)/wolfpack up

# With PYTHONDONTWRITEBYTECODE set (it is on the CI machine), every process the tests start (services,
# `wolfpack` commands) would compile each module it imports again: the test run writes its bytecode once.
test: setup
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy libs/wolfpack libs/wolfpack_games libs/wolfpack_rewards services/environment/wolfpack_environment services/reward/wolfpack_reward \
		services/inference/wolfpack_inference services/curriculum/wolfpack_curriculum \
		services/rollout/wolfpack_rollout services/trainer/wolfpack_trainer services/web/wolfpack_web

proto: setup
	$(BIN)/python proto/generate.py

proto-check: setup  # buf lint + buf breaking against proto/buf-baseline.binpb, and the import contracts
	$(BIN)/python proto/buf_check.py lint
	$(BIN)/python proto/buf_check.py breaking
	$(BIN)/lint-imports --no-cache

bench: setup
	$(BIN)/python bench/run.py

# Mutation testing of the core modules against their own fast tests (a sample per module; see its --help).
mutate: setup
	$(BIN)/python bench/mutation/run.py --report bench/results/mutation-survivors.md

clean:
	rm -rf .wolfpack .pytest_cache .mypy_cache .ruff_cache
