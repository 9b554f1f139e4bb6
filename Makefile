# One command set for developers and CI (STYLE.md 17). `make help` lists the targets.
#
#   make setup   fresh machine -> .venv with dev tools and nyala built (release) in it
#   make test    setup + every check CI runs (formatting, lints, types, Rust and Python tests,
#                the slow and stress tests included)
#   make demo    setup + the main job: a 3-tserver cluster, 1M rows, a leader SIGKILLed
#   make bench   setup + every benchmark in benches/ with --quick
#   make wheel   a release wheel in dist/, installed into a fresh venv and imported

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
STAMPS := $(CURDIR)/.stamps
# A target dir outside the clone keeps a clean clone's build incremental on the same machine.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/nyala/target
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export VIRTUAL_ENV := $(VENV)
export PATH := $(VENV)/bin:$(PATH)
# Tests that start PySpark need these (DEVELOPERS.md); harmless elsewhere.
export PYSPARK_PYTHON := $(PY)
export SPARK_LOCAL_IP := 127.0.0.1

PYTEST_DEFAULT := -m "not sim and not chaos and not stress and not slow"
# The crash proofs (copies killed midway, unsafe recovery, moves across a master failover, DDL
# under forced master elections): part of CI, apart from the default suite for quick runs.
PYTEST_SLOW := -m "slow or stress"

.PHONY: help setup build test lint rust-test py-test py-test-slow proto proto-check bench wheel \
	demo clean

help:
	@sed -n 's/^#   //p' Makefile

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMPS)/deps: requirements-dev.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	@mkdir -p $(STAMPS) && touch $@

setup: $(STAMPS)/deps build

# Incremental: cargo rebuilds only what changed. The editable install gets no bytecode from
# pip, and with PYTHONDONTWRITEBYTECODE set (as on our machines) every server, Spark worker and
# CLI process would compile nyala's sources at start-up; compiling them here once is what pip
# does for a wheel.
build: $(STAMPS)/deps
	cd $(CURDIR) && maturin develop --release --quiet
	$(PY) -m compileall -q python/nyala

lint: $(STAMPS)/deps proto-check
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	ruff check python tests benches
	ruff format --check python tests benches
	mypy
	$(PY) -m mypy.stubtest nyala._native --allowlist .stubtest-allowlist

# Generated protobuf/gRPC code is committed (python/nyala/_proto); CI checks it is current.
proto: $(STAMPS)/deps
	bash scripts/gen_proto.sh

proto-check: $(STAMPS)/deps
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && bash scripts/gen_proto.sh "$$tmp" \
		&& diff -r -x __pycache__ "$$tmp" python/nyala/_proto \
		|| { echo "python/nyala/_proto is stale: run make proto" >&2; exit 1; }

# pyext is excluded: its code is exercised through Python (linking libpython into a Rust test
# binary would need a shared libpython, which pyenv-built interpreters may not have).
rust-test:
	cargo test --workspace --exclude nyala-pyext --quiet

py-test: build
	$(PY) -m pytest $(PYTEST_DEFAULT) -q --durations=15

py-test-slow: build
	$(PY) -m pytest $(PYTEST_SLOW) -q --durations=15

test: setup lint rust-test wheel py-test py-test-slow

bench: setup
	@set -e; for b in benches/*.py; do echo "== $$b"; $(PY) $$b --quick; done

wheel: $(STAMPS)/deps
	rm -rf dist
	maturin build --release --out dist --compatibility manylinux_2_34 --auditwheel skip
	bash scripts/check_wheel.sh dist

demo: setup
	$(PY) -m nyala.cli.demo

clean:
	rm -rf $(VENV) $(STAMPS) dist
