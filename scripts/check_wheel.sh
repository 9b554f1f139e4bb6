#!/usr/bin/env bash
# Installs the wheel from $1 into a throw-away venv and imports it, as a user would after
# `pip install nyala`.
set -euo pipefail
dist=${1:?usage: check_wheel.sh DIST_DIR}
wheel=$(ls "$dist"/nyala-*.whl | head -n 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q "$wheel"
cd "$tmp"
"$tmp/venv/bin/python" -c 'import nyala, nyala._native as n; print("installed nyala", nyala.__version__, "from", nyala.__file__); assert n.error_classes()'
echo "wheel OK: $(basename "$wheel")"
