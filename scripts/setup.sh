#!/usr/bin/env bash
# Sets kvfs up on a fresh Debian 12 machine: packages, a Release build, the default model.
# Usage: scripts/setup.sh   (then see README: build/daemon/kvfsd --mount /tmp/kvfs finds the model)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
# The default model: the shared TinyStories model next to the checkout (KVFS_TEST_DATA
# overrides where that is), linked as models/default.gguf.
shared=${KVFS_TEST_DATA:-$(pwd)/../shared}
mkdir -p models
if [ ! -e models/default.gguf ]; then
  if [ -f "$shared/models/stories260K.gguf" ]; then
    ln -s "$(cd "$shared/models" && pwd)/stories260K.gguf" models/default.gguf
  else
    echo "setup: no default model found at $shared/models/stories260K.gguf;" >&2
    echo "       put any llama/qwen2 GGUF at models/default.gguf" >&2
    exit 1
  fi
fi
echo "setup: done. Default model: models/default.gguf -> $(readlink -f models/default.gguf)"
