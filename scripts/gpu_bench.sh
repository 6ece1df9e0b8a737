#!/usr/bin/env bash
# Issue 7's speed figures on a lent GPU machine: `kvfs bench --backend vulkan`, pp512 and tg128,
# per model and KV format, and the decode bandwidth as a fraction of what the device's memory
# moves in a copy. Run from the repository root there, with .gpu/ (scripts/gpu_bundle.sh) carried:
#   bash scripts/gpu_bench.sh
# First it runs the Vulkan tests on the device (lavapipe, where CI runs them, executes a
# dispatch's workgroups nearly in order; a GPU runs them at once, which the one-pass split sums
# and the SwiGLU epilogue's counters depend on). Writes four files into $OUT (the device tool's
# folder, which returns at most 8; else /tmp/kvfs-gpu): tests.txt (the tests' failures and
# totals), gpu.txt (nvidia-smi, kvfs devices, kvfs bench dispatch, copy bandwidth), summary.txt and runs.tgz
# (PRESET-KV-dDEPTH.json and .err per run, PRESET-shaders.txt from kvfs shaders), the last two rewritten after every run so that a
# command cut short still returns what it measured. Settings by environment:
#   KVFS_GPU_TESTS    gtest filter of the tests run first (default "*Vulkan*:*vulkan*": the Vulkan
#                     suites and the golden tests on the vulkan backend; "none" skips
#                     them), at most KVFS_GPU_TESTS_TIMEOUT seconds (default 240)
#   KVFS_GPU_PRESETS  synth_gguf.py presets (default "tinyllama-1.1b llama3.1-8b")
#   KVFS_GPU_WEIGHTS  their weight type (default Q4_0, issue 7's; q4_k_m: llama.cpp's Q4_K_M mix,
#                     Q4_K with Q6_K for attn_v, ffn_down and the output)
#   KVFS_GPU_KV       KV formats (default "f16 q4 q4k")
#   KVFS_GPU_DEPTHS   tokens already in the context (default "0 3500"; every model at one depth
#                     before the next depth)
#   KVFS_GPU_ARGS     more `kvfs bench` arguments (default "-p 512 -n 128 -r 3")
#   KVFS_GPU_VARIANTS builds of the pass to compare, each run right after the other: "default"
#                     and/or `kvfs bench` flags such as --gguf-rows, --separate-ops,
#                     --separate-matrices, --separate-softmax, --separate-swiglu, --shared-trees,
#                     --untiled-attention, --attn-split,512 or --prefetch,24 (a comma stands
#                     for a space: "--matvec-group,256,--matvec-lanes,32" is one variant of the
#                     matrix-vector shape; default "default"; e.g. "default --gguf-rows" for an
#                     A/B of the aligned weight rows); "tuned" runs with the settings `kvfs tune`
#                     found for the preset on this device (run first, once per preset, with
#                     KVFS_GPU_TUNE_ARGS, default "-d 1024 -n 16 -r 5"; its table goes into
#                     runs.tgz as PRESET-tune.txt and its file as PRESET.tuning.json)
#   KVFS_GPU_BATCHED  batch sizes for `kvfs bench batched` (e.g. "1,4,8,16"; default: none), run
#                     per preset after the runs above, for each of KVFS_GPU_BATCHED_VARIANTS
#                     (default "default --serial-attention": with and without each sequence's
#                     attention after the previous one's; --copy-kv-rows copies the new K/V rows
#                     at the end of each pass; --dispatch-per-sequence records the attention
#                     dispatches per sequence instead of one per KV layout), KV
#                     KVFS_GPU_BATCHED_KV (default q4) and
#                     KVFS_GPU_BATCHED_ARGS (default "--npp 1024 --ntg 32")
#   KVFS_GPU_PROFILE  `kvfs bench` arguments of a --profile run per depth on the first preset,
#                     for each KV of KVFS_GPU_PROFILE_KV (default q4k)
#                     (PRESET-profile-KV-dDEPTH.txt in runs.tgz; default: none)
#   KVFS_GPU_PHASES   the same with --phases (the short shaders timed mark by mark inside,
#                     phase_clock.h), run before the profile: PRESET-phases-KV-dDEPTH.txt
#   KVFS_GPU_AB       variants (as KVFS_GPU_VARIANTS, "tuned" too: then only the first preset is
#                     tuned) each run right after a default run on the first preset, KV KVFS_GPU_AB_KV (default q4k), at each depth (default: none)
#   KVFS_GPU_RUN_TIMEOUT  seconds a bench run may take (default 300)
#   KVFS_GPU_TUNE_TIMEOUT seconds kvfs tune may take per preset (default 540)
# Order: tests, gpu.txt, kvfs shaders, kvfs tune, the phases, the profile, the A/B runs, the
# table, batched.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/kvfs-gpu}
runs=/tmp/kvfs-gpu-runs
mkdir -p "$out" "$runs"
[ -x .gpu/bin/kvfs ] || { echo "gpu_bench: .gpu/bin/kvfs missing: run scripts/gpu_bundle.sh and carry .gpu" >&2; exit 2; }
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# The image's driver is not where the loader looks (VK_ICD_FILENAMES for loaders before 1.3.234).
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$icd" ]; then export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd; fi
kvfs=.gpu/bin/kvfs
wtype=${KVFS_GPU_WEIGHTS:-Q4_0}
if [ "$wtype" = q4_k_m ]; then synth_type=(--mix q4_k_m); else synth_type=(--type "$wtype"); fi
# Without a device the bench falls back to the CPU: figures that would say nothing of the GPU.
$kvfs devices > /dev/null || { echo "gpu_bench: no Vulkan device (kvfs devices failed)" >&2; exit 2; }
models=/tmp/kvfs-models
mkdir -p "$models"
presets=${KVFS_GPU_PRESETS:-"tinyllama-1.1b llama3.1-8b"}
# The benchmark models are made while the tests run (a temporary name until complete).
synth_pids=()
for p in $presets; do
  m="$models/$p-$wtype.gguf"
  [ -f "$m" ] && continue
  { python3 .gpu/shared/tools/synth_gguf.py --preset "$p" "${synth_type[@]}" -o "$m.part" -q && mv "$m.part" "$m"; } &
  synth_pids+=($!)
done

# The Vulkan tests, on this device, against the CPU's scalar reference and the golden data.
# CI=true: a test that finds no device or no data fails instead of skipping.
filter=${KVFS_GPU_TESTS:-*Vulkan*:*vulkan*}
if [ "$filter" != none ]; then
  start=$SECONDS
  {
    echo "== kvfs_tests --gtest_filter=$filter"
    bash .gpu/shared/tools/make_test_models.sh /tmp/kvfs-testmodels > /dev/null || echo "gpu_bench: make_test_models.sh failed"
    # In 8 shards at once: the tests' CPU references take most of their time off lavapipe.
    shards=8 failed=0
    shard_pids=()
    for i in $(seq 0 $((shards - 1))); do
      CI=true KVFS_TEST_DATA="$PWD/.gpu/shared" KVFS_TEST_MODELS=/tmp/kvfs-testmodels \
        GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${KVFS_GPU_TESTS_TIMEOUT:-240}" \
        .gpu/bin/kvfs_tests --gtest_filter="$filter" --gtest_brief=1 > "$runs/tests-$i.txt" 2>&1 &
      shard_pids+=($!)
    done
    for pid in "${shard_pids[@]}"; do
      wait "$pid" || failed=$((failed + 1))
    done
    for i in $(seq 0 $((shards - 1))); do
      echo "-- shard $i"; grep -Ev '^\[[0-9-]+ [0-9:.]+\] \[info\]|^Running main' "$runs/tests-$i.txt"
    done
    echo "== kvfs_tests: $failed of $shards shards failed or timed out, $((SECONDS - start)) s"
  } > "$out/tests.txt" 2>&1
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^== kvfs_tests' "$out/tests.txt"
fi

{
  echo "== nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  echo "== kvfs devices"; $kvfs devices 2>&1
  # What a dispatch and its barrier cost, and the read-ahead's rate (kvfs bench --prefetch).
  echo "== kvfs bench dispatch"; timeout 120 $kvfs bench dispatch 2>&1
  echo "== copy bandwidth"
  # Bytes read + written per second by a device-to-device copy of 1 GiB (median of 20): the
  # yardstick decode_gbs (weight and KV bytes read per token x tokens/s) is compared with.
  python3 - <<'EOF' 2>&1
import statistics, torch
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device for torch")
a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
times = []
for _ in range(20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); b.copy_(a); e.record(); torch.cuda.synchronize()
    times.append(s.elapsed_time(e) / 1000)
print("copy_gbs %.1f" % (2 * a.numel() / statistics.median(times) / 1e9))
EOF
} > "$out/gpu.txt"
cat "$out/gpu.txt"

summarize() {
  python3 - "$out" "$runs" <<'EOF'
import glob, json, os, re, sys
out, runs = sys.argv[1], sys.argv[2]
copy = None
m = re.search(r"copy_gbs ([0-9.]+)", open(os.path.join(out, "gpu.txt")).read())
if m: copy = float(m.group(1))
rows = ["%-44s %-4s %6s %10s %10s %9s %s" % ("run", "kv", "depth", "pp t/s", "tg t/s", "dec GB/s", "of copy bw")]
for f in sorted(glob.glob(os.path.join(runs, "*.json"))):
    try: j = json.load(open(f))
    except ValueError: continue
    if "pp" not in j: continue  # PRESET.tuning.json
    name = os.path.basename(f)[:-5]
    gbs = j.get("decode_gbs", 0.0)
    rows.append("%-44s %-4s %6d %10.1f %10.1f %9.1f %s" % (name, j.get("kv"), j.get("depth", 0),
                j["pp"]["median"], j["tg"]["median"], gbs, "%.0f%%" % (100 * gbs / copy) if copy else "-"))
    rows.append("    %s" % j.get("kernels"))
batched = sorted(glob.glob(os.path.join(runs, "*.bjson")))
if batched:
    rows.append("%-44s %-4s %5s %10s %10s %9s" % ("batched run", "kv", "npl", "tg t/s", "step ms", "vs npl 1"))
for f in batched:
    try: j = json.load(open(f))
    except ValueError: continue
    for r in j.get("results", []):
        rows.append("%-44s %-4s %5d %10.1f %10.2f %9.2f" % (os.path.basename(f)[:-6], j.get("kv"), r["npl"],
                    r["tg_tokens_per_s"], r["step_ms"], r["tg_vs_one"]))
open(os.path.join(out, "summary.txt"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
}

for pid in "${synth_pids[@]}"; do wait "$pid" || { echo "gpu_bench: synth_gguf.py failed" >&2; exit 1; }; done
for p in $presets; do
  m="$models/$p-$wtype.gguf"
  # What the device's compiler made of the matrix shaders (registers, spills, occupancy): the
  # same report RADV's null device gives without a GPU (docs/performance.md).
  $kvfs shaders -m "$m" > "$runs/$p-shaders.txt" 2>&1 || echo "gpu_bench: kvfs shaders $p failed" >&2
done
# "tuned" among the variants tunes every preset; among the A/B variants alone, the first.
tune_presets=""
case " ${KVFS_GPU_AB:-} " in *" tuned "*) tune_presets=${presets%% *} ;; esac
case " ${KVFS_GPU_VARIANTS:-default} " in *" tuned "*) tune_presets=$presets ;; esac
case " $tune_presets " in
  *[a-z]*)
    for p in $tune_presets; do
      # shellcheck disable=SC2086  # KVFS_GPU_TUNE_ARGS is a list of arguments
      timeout "${KVFS_GPU_TUNE_TIMEOUT:-540}" $kvfs tune -m "$models/$p-$wtype.gguf" ${KVFS_GPU_TUNE_ARGS:--d 1024 -n 16 -r 5} \
        -o "$runs/$p.tuning.json" > "$runs/$p-tune.txt" 2>&1 ||
        echo "gpu_bench: kvfs tune $p failed (rc $?): $(tail -c 300 "$runs/$p-tune.txt")" >&2
      tail -4 "$runs/$p-tune.txt"
      tar -czf "$out/runs.tgz" -C "$runs" .
    done
    ;;
esac
# One `kvfs bench` run: preset, KV format, depth, variant, a prefix for the run's name.
bench_one() {
  local p=$1 kv=$2 d=$3 v=$4 prefix=$5 flags="" suffix=""
  [ "$v" = default ] || { flags=${v//,/ }; suffix="-${v#--}"; suffix=${suffix//,/-}; }
  [ "$v" = tuned ] && flags="--tuning $runs/$p.tuning.json"
  local run="$runs/$prefix$p-$kv-d$d$suffix"
  # shellcheck disable=SC2086  # KVFS_GPU_ARGS and flags are lists of arguments
  timeout "${KVFS_GPU_RUN_TIMEOUT:-300}" $kvfs bench -m "$models/$p-$wtype.gguf" --backend vulkan --kv "$kv" -d "$d" $flags \
    ${KVFS_GPU_ARGS:--p 512 -n 128 -r 3} --json > "$run.json" 2> "$run.err" ||
    echo "gpu_bench: $p $kv depth $d $v failed (rc $?): $(tail -c 300 "$run.err")" >&2
  summarize > /dev/null
  tar -czf "$out/runs.tgz" -C "$runs" .
}
first=${presets%% *}
# Where a decode step's device time goes, per shader (KVFS_GPU_PROFILE) and inside the short
# shaders (KVFS_GPU_PHASES), on the first preset at each depth, for each KV of
# KVFS_GPU_PROFILE_KV (default q4k, the agents' default): the variables hold the bench arguments
# (e.g. "-p 512 -n 32 -r 1").
for what in phases profile; do
  args=$([ "$what" = phases ] && echo "${KVFS_GPU_PHASES:-}" || echo "${KVFS_GPU_PROFILE:-}")
  [ -n "$args" ] || continue
  for d in ${KVFS_GPU_DEPTHS:-0 3500}; do
    for kv in ${KVFS_GPU_PROFILE_KV:-q4k}; do
      # shellcheck disable=SC2086  # the arguments are a list
      timeout "${KVFS_GPU_RUN_TIMEOUT:-300}" $kvfs bench -m "$models/$first-$wtype.gguf" --backend vulkan --kv "$kv" -d "$d" \
        $args "--$what" > "$runs/$first-$what-$kv-d$d.txt" 2>&1 || echo "gpu_bench: $what ($kv) at depth $d failed" >&2
      tar -czf "$out/runs.tgz" -C "$runs" .
    done
  done
done
# A/B of the pass's variants (KVFS_GPU_AB: flags as in KVFS_GPU_VARIANTS) against the default,
# each right after a default run, on the first preset with KV KVFS_GPU_AB_KV (default q4k) at
# each depth: runs named ab-FLAG-PRESET-KV-dDEPTH[-FLAG].
if [ -n "${KVFS_GPU_AB:-}" ]; then
  for d in ${KVFS_GPU_DEPTHS:-0 3500}; do
    for v in $KVFS_GPU_AB; do
      tag=${v#--}; tag="ab-${tag//,/-}-"
      bench_one "$first" "${KVFS_GPU_AB_KV:-q4k}" "$d" default "$tag"
      bench_one "$first" "${KVFS_GPU_AB_KV:-q4k}" "$d" "$v" "$tag"
    done
  done
fi
# The table of every preset, KV format and depth last: the profile and the A/B runs above are
# what a lease cut short should have returned first.
for d in ${KVFS_GPU_DEPTHS:-0 3500}; do
  for p in $presets; do
    for kv in ${KVFS_GPU_KV:-f16 q4 q4k}; do
      for v in ${KVFS_GPU_VARIANTS:-default}; do bench_one "$p" "$kv" "$d" "$v" ""; done
    done
  done
done
if [ -n "${KVFS_GPU_BATCHED:-}" ]; then
  for p in $presets; do
    for v in ${KVFS_GPU_BATCHED_VARIANTS:-default --serial-attention}; do
      flags="" suffix=""
      [ "$v" = default ] || { flags=$v; suffix="-${v#--}"; }
      run="$runs/batched-$p$suffix"
      # shellcheck disable=SC2086  # KVFS_GPU_BATCHED_ARGS and flags are lists of arguments
      timeout 300 $kvfs bench batched -m "$models/$p-$wtype.gguf" --backend vulkan --kv "${KVFS_GPU_BATCHED_KV:-q4}" \
        --npl "$KVFS_GPU_BATCHED" ${KVFS_GPU_BATCHED_ARGS:---npp 1024 --ntg 32} ${suffix:+$flags} --json \
        > "$run.bjson" 2> "$run.err" || echo "gpu_bench: batched $p $v failed (rc $?): $(tail -c 300 "$run.err")" >&2
      summarize > /dev/null
      tar -czf "$out/runs.tgz" -C "$runs" .
    done
  done
fi
summarize
