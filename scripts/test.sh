#!/usr/bin/env bash
# The whole test suite. Installs what the cross-checks against independent implementations need
# (gguf-py from PyPI, the real Gemma 3 270M GGUF into the user cache), then runs every test,
# including the ones marked #[ignore] for needing them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check numpy "gguf==0.19.0" >&2
ONEBIT_GEMMA_GGUF="$(scripts/fetch-gemma.sh)"
export ONEBIT_GEMMA_GGUF
cargo test --workspace -- --include-ignored
