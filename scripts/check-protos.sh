#!/usr/bin/env bash
# Compiles the standalone GPU prototypes (crates/hayai-cuda/proto) in the configurations the GPU
# sessions run, for sm_90 and sm_86, so that a change to the kernels' shared helpers
# (kernels/common.cuh) cannot break them unnoticed. Needs nvcc only (scripts/setup-cuda.sh), no GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvcc="${NVCC:-}"
if [ -z "$nvcc" ]; then
  for n in "$root"/.venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc; do [ -x "$n" ] && nvcc="$n"; done
fi
[ -n "$nvcc" ] || nvcc="$(command -v nvcc || true)"
[ -n "$nvcc" ] || { echo "error: no nvcc (run scripts/setup-cuda.sh)" >&2; exit 1; }
proto="$root/crates/hayai-cuda/proto"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
n=0
build() {  # ARCH FILE [DEFINES...]
  local arch=$1 file=$2; shift 2
  "$nvcc" -O3 -std=c++17 -arch="$arch" "$@" -c -o "$out/p$n.o" "$proto/$file" \
    || { echo "error: $file for $arch with $* does not compile" >&2; exit 1; }
  n=$((n + 1))
}
for arch in sm_90 sm_86; do
  build "$arch" stream_rate.cu
  build "$arch" link_rate.cu
  build "$arch" stream_step.cu -DA8=1
  build "$arch" stream_step.cu -DW16=1
done
build sm_90 stream_step.cu -DA8=1 -DSTEPPED=1 -DKW1DIRECT=1 -DPOLLW=1
build sm_90 stream_step.cu -DNW=8 -DOFFSET=1
build sm_90 stream_step.cu -DA8=1 -DOPSMEM=0
build sm_86 stream_step.cu -DA8=1 -DDP4A=1
build sm_86 stream_step.cu -DA8=1 -DATTSTAGE=0
# The ring and stream variants the performance notes compare (tenth session).
build sm_90 stream_step.cu -DA8=1 -DRINGFLAGS=0 -DPFD=0 -DTHROTTLE=2
build sm_90 stream_step.cu -DA8=1 -DNOMBAR=1
build sm_90 stream_step.cu -DA8=1 -DRFDIAG=1 -DREPL=1 -DREDUXQ=0 -DPSLEEP=0
build sm_86 stream_step.cu -DA8=1 -DRINGFLAGS=0
build sm_90 stream_step.cu -DA8=1 -DREAL=1
build sm_86 stream_step.cu -DA8=1 -DREAL=1
build sm_90 stream_step.cu -DA8=1 -DREAL=1 -DARGMAX=1
echo "prototypes compile ($n builds)"
