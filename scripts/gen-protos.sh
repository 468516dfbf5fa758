#!/usr/bin/env bash
# Generate Python protobuf modules for NRI (and, for the tests, the CRI gRPC client) from the
# .proto files Debian packages ship, into the venv as the package `pbgen` (never into the
# repository). NRI's API is pinned to what containerd 1.7 in Debian 13 is built with:
# containerd/nri 0.6.1, protocol package nri.pkg.api.v1alpha1 (see docs/nri.md).
#   scripts/gen-protos.sh VENV CACHE_DIR [cri]
set -euo pipefail
VENV=$1; CACHE=$2; WANT_CRI=${3:-}
ROOT="$CACHE/root/usr/share/gocode/src"
NRI="$ROOT/github.com/containerd/nri/pkg/api/api.proto"
CRI="$ROOT/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
OUT="$SITE/pbgen"
[ -f "$OUT/nri/api_pb2.py" ] && { [ -z "$WANT_CRI" ] || [ -f "$OUT/cri/api_pb2_grpc.py" ]; } && exit 0
echo "gen-protos: generating pbgen (NRI${WANT_CRI:+, CRI}) into $SITE"
SRC=$(mktemp -d); trap 'rm -rf "$SRC"' EXIT
mkdir -p "$SRC/pbgen/nri" "$SRC/pbgen/cri"
cp "$NRI" "$SRC/pbgen/nri/api.proto"
args=(pbgen/nri/api.proto)
if [ -n "$WANT_CRI" ]; then
    # The CRI file only uses gogoproto for Go code generation options: drop them.
    grep -v gogo "$CRI" > "$SRC/pbgen/cri/api.proto"
    args+=(pbgen/cri/api.proto)
fi
"$VENV/bin/python" -m grpc_tools.protoc -I "$SRC" --python_out="$SITE" --grpc_python_out="$SITE" "${args[@]}"
touch "$OUT/__init__.py" "$OUT/nri/__init__.py"; [ -z "$WANT_CRI" ] || touch "$OUT/cri/__init__.py"
