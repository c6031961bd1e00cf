#!/usr/bin/env bash
# Parity and speed checks of the CUDA backend on a GPU machine.
#
# Here (no GPU needed):   scripts/gpu-check.sh build
#   builds target/release/examples/gpu_check (kernels embedded; needs scripts/setup-cuda.sh).
# There (GPU machine):    scripts/gpu-check.sh run [parity] [e4b-parity] [bench] [bench-bf16]
#   runs the carried binary; logs go to $OUT (or ./out) as gpu-check.log.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/target/release/examples/gpu_check"
case "${1:-}" in
  build)
    "$root/scripts/setup-cuda.sh"
    cargo build --release -p hayai-cuda --example gpu_check
    strip "$bin" 2>/dev/null || true
    ls -la "$bin"
    ;;
  run)
    shift
    out="${OUT:-$root/out}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv | tee "$out/gpu-check.log"
    date -u | tee -a "$out/gpu-check.log"
    "$bin" "$@" 2>&1 | tee -a "$out/gpu-check.log"
    ;;
  *)
    echo "usage: $0 build | run [parity] [e4b-parity] [bench] [bench-bf16]" >&2
    exit 2
    ;;
esac
