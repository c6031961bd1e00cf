#!/usr/bin/env bash
# Builds and runs the streamed-step prototype (crates/hayai-cuda/proto/stream_step.cu) on the GPU
# machine: `scripts/proto-stream.sh [ARGS...]` (nvcc there, or NVCC=...), once per build in BUILDS
# (default "NW=8"; e.g. BUILDS="NW=8 NW=8,OFFSET=1 NW=16": consumer warps, offset-binary nibbles).
# Prints each configuration's step time in five modes (full chain, no input waits, stream only,
# compute only, cells only; PROTO_MODES=024 picks some), the check against the plain GEMV chain
# and a per-operation breakdown; `--tiny` shrinks every operation to one 16 x 128 tile per SM (the
# chain's own cost per operation), `--chunks N` keeps the N-chunk rings only, PROTO_LEAN=only the
# lean variant only. docs/performance.md records what it measured.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvcc="${NVCC:-nvcc}"
arch="${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)}"
builds=(${BUILDS:-NW=8})
for b in "${builds[@]}"; do
  defs=(); IFS=, read -ra kv <<< "$b"; for d in "${kv[@]}"; do defs+=("-D$d"); done
  "$nvcc" -O3 -std=c++17 -arch="sm_${arch:-90}" "${defs[@]}" -o "${TMPDIR:-/tmp}/stream_step_${b//[=,]/_}" \
    "$root/crates/hayai-cuda/proto/stream_step.cu" &
done
wait
rc=0
for b in "${builds[@]}"; do echo "### build $b"; "${TMPDIR:-/tmp}/stream_step_${b//[=,]/_}" "$@" || rc=$?; done
exit $rc
