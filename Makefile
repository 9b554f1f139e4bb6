# One command set for developers and CI (STYLE.md 17). `make help` lists the targets.
#
#   make setup   fresh machine -> .venv with dev tools and nyala built (release) in it
#   make test    every check CI runs (formatting, lints, types, Rust and Python tests), from a
#                fresh machine; the Python tests run against the wheel it builds
#   make py-test-slow  the slow and stress tests only (crash proofs; make test runs them too)
#   make py-test-scale the scale tests (millions of rows, 500 tablets per server; not in make test)
#   make demo    setup + the main job: a 3-tserver cluster, 1M rows, a leader SIGKILLed
#   make bench   setup + every benchmark in benches/ with --quick
#   make wheel   the abi3 manylinux_2_28 wheel and the sdist in dist/, audited (wheel tools only)

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

PYTEST_DEFAULT := -m "not sim and not chaos and not stress and not slow and not scale"
# Two test processes (pytest-xdist), a test file each at a time (module fixtures stay shared):
# the suite waits on real clusters about half of its time, so two of them share the two cores
# (18 min -> 10 min on this machine). Each worker takes ports from its own range
# (tests/conftest.py). PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= 2
PYTEST_PAR := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)
# tests/packaging installs the abi3 wheel into a fresh venv of .venv's CPython and of each one
# named here: by default the newest CPython >= 3.12 that pyenv has on this machine (free-threaded
# builds, which abi3 does not serve, left out), or none.
PYENV_VERSIONS := $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions
export NYALA_WHEEL_PYTHONS ?= $(lastword $(sort $(filter-out %t/bin/python3,\
	$(wildcard $(PYENV_VERSIONS)/3.1[2-9]*/bin/python3))))
# The crash proofs (copies killed midway, unsafe recovery, moves across a master failover,
# coalesced writes through a leader kill, DDL under forced master elections): `slow` and
# `stress`, run by `make test` with the rest; `make py-test-slow` runs only them.
PYTEST_SLOW := -m "slow or stress"
PYTEST_CI := -m "not sim and not chaos and not scale"
# The sizes where things break (the 5M-row scan next to heartbeats, 10M rows streamed in, 500
# quiesced tablets per server, a 1M-row load's metrics, a minute of the consistency checker):
# each wants the machine to itself, so one at a time and not in `make test` (~10 min).
PYTEST_SCALE := -m scale

.PHONY: help setup deps build browser test lint rust-test py-test py-test-wheel install-wheel \
	py-test-slow py-test-scale proto proto-check bench wheel demo clean

help:
	@sed -n 's/^#   //p' Makefile

$(PY):
	$(PYTHON) -m venv $(VENV)

# The wheel's build tools only (maturin, zig, the auditors): all that `make wheel` needs.
$(STAMPS)/wheel-deps: requirements-wheel.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-wheel.txt
	@mkdir -p $(STAMPS) && touch $@

$(STAMPS)/deps: requirements-dev.txt $(STAMPS)/wheel-deps
	$(PY) -m pip install -q -r requirements-dev.txt
	@mkdir -p $(STAMPS) && touch $@

setup: deps build

deps: $(STAMPS)/deps browser

# The web UI's browser tests drive Debian's chromium (tests/integration/test_web_ui.py): installed
# here when missing and running as root; otherwise those tests skip and say why.
browser:
	@if ! command -v chromium >/dev/null; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			{ apt-get update -q >/dev/null \
				&& DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
			|| echo "chromium could not be installed: the web UI browser tests will skip" >&2; \
		else \
			echo "chromium missing (not root or no apt-get): the web UI browser tests will skip" >&2; \
		fi; \
	fi

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
	ruff check python tests benches scripts
	ruff format --check python tests benches scripts
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
	$(PY) -m pytest $(PYTEST_PAR) $(PYTEST_DEFAULT) -q --durations=15

# `make test` runs the Python tests against the wheel it built (the package users get), installed
# into .venv in place of the editable build: one optimised compile of the Rust core per run
# instead of two. `make build` (or `make setup`) puts the editable build back.
install-wheel: $(STAMPS)/deps
	$(PY) -m pip install -q --no-deps --force-reinstall dist/nyala-*.whl

py-test-wheel:
	$(PY) -m pytest $(PYTEST_PAR) $(PYTEST_CI) -q --durations=15

py-test-slow: build
	$(PY) -m pytest $(PYTEST_PAR) $(PYTEST_SLOW) -q --durations=15

py-test-scale: build
	$(PY) -m pytest $(PYTEST_SCALE) -q --durations=15

# Each step in turn, its time printed at the end (also when one fails): CI has 30 minutes.
TEST_STEPS := deps wheel install-wheel lint rust-test py-test-wheel
test:
	@times=""; for step in $(TEST_STEPS); do start=$$(date +%s); \
		if ! $(MAKE) --no-print-directory $$step; then \
			echo "make test: $$step failed after $$(( $$(date +%s) - start )) s;$$times"; exit 1; \
		fi; times="$$times $$step $$(( $$(date +%s) - start )) s,"; \
	done; echo "make test: passed;$$times"

bench: setup
	@set -e; for b in benches/*.py; do echo "== $$b"; $(PY) $$b --quick; done

# One wheel for CPython 3.11 and later (abi3) on glibc 2.28 and later (zig links against glibc
# 2.28's symbols), built from the sdist (so the sdist is known to build) in Cargo's `wheel`
# profile (pyproject.toml; no debug info). scripts/check_wheel.py checks tag, size and ABI.
wheel: $(STAMPS)/wheel-deps
	rm -rf dist
	# The sdist's files carry one fixed old mtime, so Cargo would take a cached build of our own
	# crates (made from older sources) as fresh; drop those (dependencies stay cached).
	cargo clean --quiet --profile wheel --target $(shell rustc -vV | sed -n "s/^host: //p") \
		-p nyala-common -p nyala-wal -p nyala-storage -p nyala-consensus -p nyala-copy -p nyala-tls \
		-p nyala-pyext
	maturin build --sdist --zig --compatibility manylinux_2_28 --auditwheel check --out dist
	$(PY) scripts/check_wheel.py dist

demo: setup
	$(PY) -m nyala.cli.demo

clean:
	rm -rf $(VENV) $(STAMPS) dist
