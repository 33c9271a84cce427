#!/usr/bin/env bash
# Build etcd + kube-apiserver for controller-runtime's envtest from the Go module
# proxy only (no setup-envtest download, no Docker). Prints the asset folder on
# stdout; use it as KUBEBUILDER_ASSETS. Re-running with the same versions is a no-op.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}     # k8s.io/kubernetes tag (module proxy serves v1.34.0 .. v1.37.2)
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}   # go.etcd.io/etcd/server/v3 tag
OUT=${1:-${ENVTEST_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/envtest-assets/k8s-$K8S_VERSION-etcd-$ETCD_VERSION}}
export GOFLAGS=-mod=mod GOWORK=off   # the wrapper modules need none of the caller's settings
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

log() { echo "[envtest-assets] $*" >&2; }
# run a command quietly; show its output only if it fails
quiet() { "$@" >"$work/cmd.log" 2>&1 || { cat "$work/cmd.log" >&2; return 1; }; }

if [ -x "$OUT/etcd" ] && [ -x "$OUT/kube-apiserver" ] &&
   [ "$("$OUT/kube-apiserver" --version 2>/dev/null)" = "Kubernetes $K8S_VERSION" ] &&
   "$OUT/etcd" --version 2>/dev/null | grep -q "etcd Version: ${ETCD_VERSION#v}$"; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- etcd: its go.mod has local replace directives, so `go install pkg@version`
# is refused; build it from a throw-away wrapper module instead.
log "building etcd $ETCD_VERSION"
mkdir "$work/etcd"
(
  cd "$work/etcd"
  quiet go mod init example.local/etcdbuild
  quiet go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  go build -trimpath -ldflags '-s -w' -o "$OUT/etcd" go.etcd.io/etcd/server/v3
)

# --- kube-apiserver: k8s.io/kubernetes replaces every k8s.io/<staging> module with
# ./staging/src/...; map each one to its published v0.N.M tag in a wrapper module.
log "building kube-apiserver $K8S_VERSION"
mkdir "$work/kas"
(
  cd "$work/kas"
  minor_patch=${K8S_VERSION#v1.}          # 37.2
  staging=v0.$minor_patch                 # v0.37.2
  major=1
  minor=${minor_patch%%.*}                # 37
  modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
  {
    printf 'module example.local/kasbuild\n\ngo 1.26.0\n\nreplace (\n'
    awk -v v="$staging" '$2 == "=>" && $3 ~ /^\.\/staging\/src\// {print "\t" $1 " => " $1 " " v}' "$modfile"
    printf ')\n'
  } > go.mod
  quiet go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION"
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  go build -trimpath -ldflags "$ld" -o "$OUT/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
)

log "etcd: $("$OUT/etcd" --version | head -1); kube-apiserver: $("$OUT/kube-apiserver" --version)"
echo "$OUT"
