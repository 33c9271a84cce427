#!/usr/bin/env bash
# Regenerate the operator's generated files from the Go markers with the
# controller-gen pinned in go.mod (`go tool controller-gen`):
#
#   operator/api/v1alpha1/zz_generated.deepcopy.go   (object)
#   operator/config/crd/bases/*.yaml                 (crd)
#   operator/config/rbac/role.yaml                   (rbac, markers in operator/internal/controller)
#   operator/config/webhook/manifests.yaml           (webhook, markers in operator/internal/webhook)
#
# Usage: hack/manifests.sh            rewrite the committed files in place
#        hack/manifests.sh OUTDIR     write the same files under OUTDIR instead
#                                     (OUTDIR/zz_generated.deepcopy.go,
#                                      OUTDIR/crd/bases, OUTDIR/rbac, OUTDIR/webhook);
#                                     the staleness test uses this.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

out=${1:-}
if [ -n "$out" ]; then
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  deepcopy="$out/zz_generated.deepcopy.go"
  cfg="$out"
else
  deepcopy="operator/api/v1alpha1/zz_generated.deepcopy.go"
  cfg="operator/config"
fi
mkdir -p "$cfg/crd/bases" "$cfg/rbac" "$cfg/webhook"

cg() { go tool controller-gen "$@"; }

# Deep-copy functions. controller-gen writes them beside the types, so when
# an OUTDIR is given the code goes through stdout instead.
if [ -n "$out" ]; then
  cg object paths=./operator/api/... output:object:stdout >"$deepcopy"
else
  cg object paths=./operator/api/...
fi
gofmt -w "$deepcopy"

# CRDs: one file per kind, named <group>_<plural>.yaml. They are generated
# into a scratch folder first, so a marker error leaves the committed files
# in place; then the folder's contents replace crd/bases (which drops the
# files of kinds that no longer exist).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cg crd:crdVersions=v1 paths=./operator/api/... output:crd:artifacts:config="$tmp"
rm -f "$cfg"/crd/bases/*.yaml
cp "$tmp"/*.yaml "$cfg/crd/bases/"

# The controller's ClusterRole, from the +kubebuilder:rbac markers.
cg rbac:roleName=inferencecache-controller paths=./operator/internal/controller/... \
  output:rbac:artifacts:config="$cfg/rbac"

# The ValidatingWebhookConfiguration, from the +kubebuilder:webhook markers.
cg webhook paths=./operator/internal/webhook/... output:webhook:artifacts:config="$cfg/webhook"
