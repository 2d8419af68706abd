# Set-up is part of every target: a fresh machine needs only python3, cargo and make.
VENV ?= .venv
BIN := $(VENV)/bin
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo loader-demo test build lint bench clean

# uv installs the Python dependencies (maturin --uv): a fresh venv in ~15 s where pip takes ~60 s.
# Unlike pip, uv writes no bytecode unless asked; where PYTHONDONTWRITEBYTECODE is set (as on CI) every
# Python process would then compile JAX, sklearn & co. from source: ~4 s of CPU per process.
$(BIN)/uv:
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip 'maturin>=1.7,<2' 'uv>=0.4'

# Builds the Rust extension (release, incremental) and installs the package with its dev extras;
# again only when a Rust source, a manifest, pyproject.toml or this recipe changed (the Python package
# is editable).
BUILD_INPUTS := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml Cargo.lock pyproject.toml Makefile
$(VENV)/.built: $(BIN)/uv $(BUILD_INPUTS)
	UV_COMPILE_BYTECODE=1 $(BIN)/maturin develop --release --extras dev --quiet --uv
	touch $@

build: $(VENV)/.built

# The main job: a short LeJEPA pretrain of the tiny ViT on the demo set, in a new run directory each time.
demo: build
	$(BIN)/birdjepa pretrain --run demo-$$(date +%Y%m%d-%H%M%S)

loader-demo: build
	$(BIN)/birdjepa loader-demo

# Rust: --release --workspace resolves the dependencies' features as maturin's build does, so the tests
# reuse everything it compiled. Python: one worker per core, each test file kept on one worker (its
# module fixtures are trained once); the 10 slowest tests are printed.
test: build
	cargo test --release --workspace --quiet
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=10

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

clean:
	rm -rf $(VENV) target
