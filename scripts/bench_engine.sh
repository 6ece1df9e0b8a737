#!/usr/bin/env bash
# Runs the engine speed benchmarks of docs/performance.md (issue 3) and prints their tables.
# Usage: scripts/bench_engine.sh MODELS_DIR   (models made by ../shared/tools/synth_gguf.py)
set -euo pipefail
cd "$(dirname "$0")/.."
m=${1:?MODELS_DIR}
kvfs=build/tools/kvfs
echo "# $(date -u)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
for f in tinyllama-1.1b-Q4_0 tinyllama-1.1b-q4_k_m tinyllama-1.1b-Q8_0 qwen2.5-0.5b-Q4_0 llama3.2-1b-Q4_0; do
  [ -f "$m/$f.gguf" ] || { echo "missing $m/$f.gguf"; continue; }
  echo "## $f"; $kvfs bench -m "$m/$f.gguf" -p 512 -n 128 -r 3 -t 2
done
for kv in f16 q4; do
  echo "## tinyllama-1.1b-Q4_0 depth 3500 kv $kv"
  $kvfs bench -m "$m/tinyllama-1.1b-Q4_0.gguf" -p 512 -n 32 -d 3500 -r 3 -t 2 --kv $kv
done
if [ -f "$m/llama3.1-8b-Q4_0.gguf" ]; then
  echo "## llama3.1-8b-Q4_0"; $kvfs bench -m "$m/llama3.1-8b-Q4_0.gguf" -p 512 -n 32 -r 1 -t 2
fi
echo "# done $(date -u)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
