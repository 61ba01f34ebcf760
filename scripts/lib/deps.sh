#!/usr/bin/env bash
# Installs the Debian packages the tests need when they are missing: cmake, GoogleTest and
# pkg-config for the C/C++ side, iproute2 (ip netns, veth) and util-linux (unshare, nsenter) for
# the simulated nodes.
set -euo pipefail
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
