#!/usr/bin/env bash
# Regenerate the Go code of the gRPC contract:
#   rpc/proto/inferencecache/v1alpha1/inferencecache.proto
#     -> <out-root>/rpc/gen/inferencecache/v1alpha1/{inferencecache.pb.go,inferencecache_grpc.pb.go}
#
# Usage: hack/proto.sh [OUT_ROOT]
#   OUT_ROOT defaults to the repository root, so a bare run rewrites the
#   committed code; rpc/gen_test.go passes a temp dir to check for staleness.
#
# protoc comes from Debian (protobuf-compiler, libprotobuf-dev). When it is
# missing and we are root with apt-get, it is installed; otherwise we fail.
# The plugins are the `tool` lines of go.mod, built from the module, so their
# versions are exactly go.mod's. The committed code was made with protoc
# $WANT_PROTOC; another protoc only changes the version line in the headers.
set -euo pipefail

WANT_PROTOC=3.21.12
MODULE=github.com/inferencecache/inferencecache
PROTO=inferencecache/v1alpha1/inferencecache.proto
GEN_DIR=rpc/gen/inferencecache/v1alpha1

log() { echo "[proto] $*" >&2; }
die() { echo "[proto] ERROR: $*" >&2; exit 1; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_root=${1:-$root}
mkdir -p "$out_root"
out_root=$(cd "$out_root" && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

# --- protoc -----------------------------------------------------------------
if ! command -v protoc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "protoc not found; installing protobuf-compiler and libprotobuf-dev with apt-get"
    pkgs=(protobuf-compiler libprotobuf-dev)
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y --no-install-recommends "${pkgs[@]}" >&2; then
      # A fresh machine may have empty package lists.
      apt-get update >&2
      apt-get install -y --no-install-recommends "${pkgs[@]}" >&2
    fi
  fi
  command -v protoc >/dev/null 2>&1 ||
    die "protoc not found. Install it with: apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev"
fi
have_protoc=$(protoc --version | awk '{print $2}')
if [ "$have_protoc" != "$WANT_PROTOC" ]; then
  log "warning: protoc $have_protoc, the committed code was generated with $WANT_PROTOC (header lines will differ)"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- plugins, at go.mod's versions -----------------------------------------
(
  cd "$root"
  go build -o "$work/bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
  go build -o "$work/bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
)

# --- generate into a scratch dir, then swap the files in -----------------------
includes=(-I "$root/rpc/proto")
# Well-known types (google/protobuf/*.proto) from libprotobuf-dev, if present.
if [ -f /usr/include/google/protobuf/descriptor.proto ]; then
  includes+=(-I /usr/include)
fi
mkdir "$work/out"
(
  cd "$root/rpc/proto"
  protoc "${includes[@]}" \
    --plugin=protoc-gen-go="$work/bin/protoc-gen-go" \
    --plugin=protoc-gen-go-grpc="$work/bin/protoc-gen-go-grpc" \
    --go_out="$work/out" --go_opt=module="$MODULE" \
    --go-grpc_out="$work/out" --go-grpc_opt=module="$MODULE" \
    "$PROTO"
)

dest="$out_root/$GEN_DIR"
mkdir -p "$dest"
rm -f "$dest"/*.pb.go
cp "$work/out/$GEN_DIR"/*.pb.go "$dest/"
log "generated $(cd "$dest" && echo *.pb.go) in $dest"
