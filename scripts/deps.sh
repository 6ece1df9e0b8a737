#!/usr/bin/env bash
# Installs the Debian 12 packages kvfs needs to build, test and run (as root, or via sudo).
# The list is scripts/debian-packages.txt (one package a line), shared with .ci/run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends $(grep -v '^#' "$here/debian-packages.txt") >/dev/null
echo "deps: installed $(grep -vc '^#' "$here/debian-packages.txt") packages"
