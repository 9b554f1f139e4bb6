#!/usr/bin/env bash
# Regenerates the Python code for proto/nyala/*.proto into python/nyala/_proto (or into the
# directory given as $1, which `make proto-check` uses to diff against the committed code).
#
# Beside each module, mypy-protobuf writes its type stub (x_pb2.pyi, x_pb2_grpc.pyi), which is
# what mypy reads for nyala._proto; its plugins (protoc-gen-mypy, protoc-gen-mypy_grpc) come
# with requirements-dev.txt, next to $python in a venv (else they are looked up on PATH).
#
# The generated modules and stubs import each other as `from nyala import x_pb2` (protoc names
# them by their path under proto/); they are rewritten to `from nyala._proto import x_pb2` so
# they live inside the package without a sys.path fix.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/python/nyala/_proto}"
python="${PYTHON:-$root/.venv/bin/python}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

plugin() {
    local beside
    beside="$(dirname "$python")/$1"
    if [[ -x "$beside" ]]; then
        echo "$beside"
    elif ! command -v "$1"; then
        echo "gen_proto.sh: $1 not found: pip install -r requirements-dev.txt" >&2
        return 1
    fi
}
mypy_plugin="$(plugin protoc-gen-mypy)"
mypy_grpc_plugin="$(plugin protoc-gen-mypy_grpc)"

cd "$root/proto"
"$python" -m grpc_tools.protoc -I. \
    --plugin=protoc-gen-mypy="$mypy_plugin" \
    --plugin=protoc-gen-mypy_grpc="$mypy_grpc_plugin" \
    --python_out="$work" --grpc_python_out="$work" \
    --mypy_out=quiet:"$work" --mypy_grpc_out=quiet:"$work" \
    nyala/*.proto

mkdir -p "$out"
rm -f "$out"/*_pb2.py "$out"/*_pb2_grpc.py "$out"/*_pb2.pyi "$out"/*_pb2_grpc.pyi
for f in "$work"/nyala/*.py "$work"/nyala/*.pyi; do
    sed -E 's/^from nyala import ([A-Za-z0-9_]+_pb2)/from nyala._proto import \1/' "$f" \
        >"$out/$(basename "$f")"
done
cat >"$out/__init__.py" <<'PY'
"""Generated protobuf and gRPC code for proto/nyala/*.proto. Do not edit: run scripts/gen_proto.sh."""
PY
