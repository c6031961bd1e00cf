#!/usr/bin/env bash
# Everything a fresh machine needs before building: checks the Rust toolchain and Python,
# installs the CUDA 13.0 compiler from PyPI into ./.venv (kernels are compiled into every
# binary; HAYAI_NO_CUDA=1 skips that), and fetches the Rust crates. Idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust (https://rustup.rs) first" >&2; exit 1; }
command -v python3 >/dev/null || { echo "error: python3 (with pip and venv) is required" >&2; exit 1; }
if [ "${HAYAI_NO_CUDA:-0}" != "1" ]; then
  scripts/setup-cuda.sh
fi
cargo fetch --locked 2>/dev/null || cargo fetch
