#!/usr/bin/env bash
# Regenerates the Python code for proto/nyala/*.proto into python/nyala/_proto (or into the
# directory given as $1, which `make proto-check` uses to diff against the committed code).
#
# The generated modules import each other as `from nyala import x_pb2` (protoc names them by
# their path under proto/); they are rewritten to `from nyala._proto import x_pb2` so they live
# inside the package without a sys.path fix.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/python/nyala/_proto}"
python="${PYTHON:-$root/.venv/bin/python}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$root/proto"
"$python" -m grpc_tools.protoc -I. --python_out="$work" --grpc_python_out="$work" nyala/*.proto

mkdir -p "$out"
rm -f "$out"/*_pb2.py "$out"/*_pb2_grpc.py
for f in "$work"/nyala/*.py; do
    sed -E 's/^from nyala import ([A-Za-z0-9_]+_pb2)/from nyala._proto import \1/' "$f" \
        >"$out/$(basename "$f")"
done
cat >"$out/__init__.py" <<'PY'
"""Generated protobuf and gRPC code for proto/nyala/*.proto. Do not edit: run scripts/gen_proto.sh."""
PY
