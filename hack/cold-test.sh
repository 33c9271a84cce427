#!/usr/bin/env bash
# Time a cold `make test` the way CI runs it: a clean clone of HEAD, .ci/run,
# empty Go build and module caches (directories of their own, so the
# machine's caches are neither used nor disturbed). The envtest binaries are
# taken from their cache when built (run `bash hack/envtest-assets.sh` first:
# the budget is measured with envtest built). Each output line is prefixed
# with the seconds since the start, so the log shows where the time goes.
#
# Usage: hack/cold-test.sh [DIR]   (default: a new temporary directory)
# Writes DIR/log and DIR/result ("total N s rc=R"); exits with make's status.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$(mktemp -d)}
mkdir -p "$dir"
rm -rf "$dir/repo" "$dir/gocache" "$dir/mod"
git clone -q "$repo" "$dir/repo" || exit 1
# Tests read the shared trace from ../shared, as in the project's checkout.
[ -e "$repo/../shared" ] && ln -sfn "$(cd "$repo/../shared" && pwd)" "$dir/shared"

start=$EPOCHSECONDS
echo "cold make test of $(git -C "$dir/repo" rev-parse --short HEAD) in $dir" >&2
(
  cd "$dir/repo" &&
    GOCACHE=$dir/gocache GOMODCACHE=$dir/mod GOFLAGS=-modcacherw CI=true bash .ci/run 2>&1
) | while IFS= read -r line; do printf '%5d %s\n' $((EPOCHSECONDS - start)) "$line"; done >"$dir/log"
rc=${PIPESTATUS[0]}
echo "total $((EPOCHSECONDS - start)) s rc=$rc" | tee "$dir/result"
exit "$rc"
