#!/usr/bin/env bash
# Packs what scripts/gpu_bench.sh needs on a lent GPU machine, which has none of our Debian
# packages and reaches nothing outside: the kvfs binary and the test binary (the Vulkan tests run
# on the device before the figures), the shared libraries they link besides glibc and libstdc++
# (newer ones there run a binary built here), glvnd's libraries for the NVIDIA Vulkan driver,
# and of the shared test data what those tests and the model synthesizer read: the synthesizer
# with the two vocabularies its presets use, the test-model script, stories260K and golden/
# (models are made there: a Q4_0 llama3.1-8b, or the 152 MB of test models, does not fit the
# device tool's 64 MiB of carry).
# Run here after building with Vulkan on (the default):
#   scripts/gpu_bundle.sh [BUILD_DIR]    (then the device tool: command `bash scripts/gpu_bench.sh`,
#                                         carry [".gpu"])
# .gpu/ is listed in .git/info/exclude, so git ignores it and only `carry` takes it along.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shared=${KVFS_TEST_DATA:-../shared}
kvfs="$build/tools/kvfs"
tests="$build/tests/kvfs_tests"
[ -x "$kvfs" ] || { echo "gpu_bundle: $kvfs not built" >&2; exit 2; }
[ -x "$tests" ] || { echo "gpu_bundle: $tests not built" >&2; exit 2; }
ldd "$kvfs" | grep -q libvulkan || { echo "gpu_bundle: $kvfs was built without Vulkan (-DKVFS_VULKAN=ON)" >&2; exit 2; }
for f in "$shared/tools/synth_gguf.py" "$shared/tools/make_test_models.sh" "$shared/models/stories260K.gguf" \
         "$shared/models/vocab/ggml-vocab-llama-spm.gguf" "$shared/models/vocab/ggml-vocab-gpt-2.gguf" \
         "$shared/golden"; do
  [ -e "$f" ] || { echo "gpu_bundle: $f not found (KVFS_TEST_DATA)" >&2; exit 2; }
done

rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib .gpu/shared/tools .gpu/shared/models/vocab
cp "$kvfs" .gpu/bin/
strip -o .gpu/bin/kvfs_tests "$tests"  # 9.5 MB -> about 6: the symbols are not needed there
# Every library ldd resolves, except the C and C++ runtimes the machine has in newer versions.
ldd "$kvfs" "$tests" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' |
  sort -u | while read -r lib; do cp -L "$lib" .gpu/lib/; done
# NVIDIA's Vulkan driver (libGLX_nvidia) finds no instance entry points without glvnd's libraries
# beside it (seen on an H100 machine: "Could not get 'vkCreateInstance'"), and the lent machines
# have none: take Debian's, unpacked, not installed.
debs=$(mktemp -d); chmod 755 "$debs"  # apt-get downloads as _apt
(cd "$debs" && apt-get download -q libglvnd0 libglx0 libegl1 libgl1 libopengl0 libgles2 >/dev/null) ||
  { echo "gpu_bundle: apt-get download of glvnd's libraries failed" >&2; exit 2; }
for deb in "$debs"/*.deb; do dpkg -x "$deb" "$debs/root"; done
cp -L "$debs"/root/usr/lib/x86_64-linux-gnu/lib*.so.[0-9] .gpu/lib/
rm -rf "$debs"
# The layout of ../shared, so the tests find it as KVFS_TEST_DATA=.gpu/shared.
cp "$shared/tools/synth_gguf.py" "$shared/tools/make_test_models.sh" .gpu/shared/tools/
cp "$shared/models/stories260K.gguf" .gpu/shared/models/
cp "$shared/models/vocab/ggml-vocab-llama-spm.gguf" "$shared/models/vocab/ggml-vocab-gpt-2.gguf" .gpu/shared/models/vocab/
cp -r "$shared/golden" .gpu/shared/

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
echo "gpu_bundle: .gpu/ holds $(du -sh .gpu | cut -f1): $(ls .gpu/lib | tr '\n' ' ')"
