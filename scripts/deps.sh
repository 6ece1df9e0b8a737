#!/usr/bin/env bash
# Installs the Debian 12 packages kvfs needs to build, test and run (as root, or via sudo).
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config git python3 ca-certificates
  libspdlog-dev nlohmann-json3-dev libzstd-dev libxxhash-dev
  libfuse3-dev fuse3 attr jq
  libvulkan-dev glslang-tools mesa-vulkan-drivers
  libgtest-dev libgmock-dev libbenchmark-dev
  unicode-data
  clang libclang-rt-14-dev
)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
echo "deps: installed ${#PKGS[@]} packages"
