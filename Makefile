# Set-up is part of every target: a fresh machine needs only python3, cargo and make.
VENV ?= .venv
BIN := $(VENV)/bin
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo loader-demo test build lint bench clean lock wheel

# The build tools, pinned (the versions uv.lock holds for maturin): uv installs the locked Python
# dependencies, a fresh venv in ~15 s where pip takes ~60 s. Unlike pip, uv writes no bytecode unless
# asked; where PYTHONDONTWRITEBYTECODE is set (as on CI) every Python process would then compile JAX,
# sklearn & co. from source: ~4 s of CPU per process.
UV_VERSION := 0.13.9
MATURIN_VERSION := 1.16.0
$(BIN)/uv:
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q 'maturin==$(MATURIN_VERSION)' 'uv==$(UV_VERSION)'

# Installs every Python dependency at the version uv.lock pins (--locked: refuses a lock that no longer
# matches pyproject.toml), then builds the Rust extension (release, incremental) and installs the package
# editable, its dependencies already satisfied. Again only when a Rust source, a manifest, the lock or
# this recipe changed. To upgrade deliberately: `make lock` (or `.venv/bin/uv lock --upgrade-package jax`),
# then commit uv.lock.
BUILD_INPUTS := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml Cargo.lock pyproject.toml uv.lock Makefile
$(VENV)/.built: $(BIN)/uv $(BUILD_INPUTS)
	UV_PROJECT_ENVIRONMENT=$(abspath $(VENV)) UV_COMPILE_BYTECODE=1 $(BIN)/uv sync --locked --inexact --extra dev --no-install-project --quiet
	UV_COMPILE_BYTECODE=1 $(BIN)/maturin develop --release --extras dev --quiet --uv
	touch $@

lock: $(BIN)/uv
	$(BIN)/uv lock --upgrade

# A wheel for machines without Rust: manylinux2014 (glibc 2.17+, linked through zig, pinned), abi3 (any
# CPython 3.11+, as the lock's jax needs), beside requirements.txt, the locked versions of its
# dependencies. On the node:
#   python3 -m venv .venv && .venv/bin/pip install -r dist/requirements.txt dist/birdjepa-*.whl
ZIG_VERSION := 0.17.1
WHEEL_DIR ?= dist
wheel: $(BIN)/uv
	$(BIN)/pip install -q 'ziglang==$(ZIG_VERSION)'
	rm -f $(WHEEL_DIR)/birdjepa-*.whl
	$(BIN)/maturin build --release --zig --compatibility manylinux2014 --quiet --out $(WHEEL_DIR)
	$(BIN)/uv export --locked --no-emit-project --no-hashes --quiet --output-file $(WHEEL_DIR)/requirements.txt

build: $(VENV)/.built

# The main job: a short LeJEPA pretrain of the tiny ViT on the demo set, in a new run directory each time
# (DEMO_ARGS: more options; the slow learning test runs this target with --log.runs-dir). Named in UTC: in
# local time two runs an hour apart on the night clocks go back got one name, the second resuming the first.
DEMO_ARGS ?=
demo: build
	$(BIN)/birdjepa pretrain --run demo-$$(date -u +%Y%m%d-%H%M%SZ) $(DEMO_ARGS)

loader-demo: build
	$(BIN)/birdjepa loader-demo

# Rust: --release --workspace resolves the dependencies' features as maturin's build does, so the tests
# reuse everything it compiled. Python: one worker per core, each test file kept on one worker (its
# module fixtures are trained once); the 10 slowest tests are printed. Bytecode written even where
# PYTHONDONTWRITEBYTECODE is set (as on CI; __pycache__ is ignored by git): pytest rewrites every test
# file's asserts (~2 s a worker) and each `birdjepa` the tests start compiles the package's sources
# (~0.1 s) again where none is kept.
test: build
	cargo test --release --workspace --quiet
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=10

lint: build
	cargo clippy --all-targets -- -D warnings
	$(BIN)/ruff check src tests scripts notebooks docs
	$(BIN)/ruff format --check src tests scripts notebooks docs

bench: build
	$(BIN)/python scripts/bench_loader.py
	$(BIN)/python scripts/bench_iid.py
	$(BIN)/python scripts/bench_monitor.py
	$(BIN)/python scripts/bench_train.py
	$(BIN)/python scripts/bench_eval.py
	$(BIN)/python scripts/bench_startup.py
	$(BIN)/python scripts/bench_trace.py

# The suite's compile caches are the user's, shared by checkouts: $BIRDJEPA_CACHE/test-xla (tests/conftest.py)
# and test-wheel (tests/test_wheel.py).
clean:
	rm -rf $(VENV) target
