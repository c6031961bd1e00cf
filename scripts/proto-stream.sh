#!/usr/bin/env bash
# Builds and runs the streamed-step prototype (crates/hayai-cuda/proto/stream_step.cu) on the GPU
# machine: `scripts/proto-stream.sh [ARGS...]` (nvcc there, or NVCC=...), once per build in BUILDS
# (default "A8=1"; e.g. BUILDS="A8=1 NW=8 NW=8,OFFSET=1 A8=1,NP=2 W16=1": W4A8, consumer warps,
# offset-binary nibbles, producer warps, bf16 weights).
# Prints each configuration's step time in six modes (full chain, no input waits, stream only,
# compute only, cells only, producer only; PROTO_MODES=0245 picks some), the check of every
# operation against a reference applied to the chain's own input
# and a per-operation breakdown; `--tiny` shrinks every operation to one 16 x 128 tile per SM (the
# chain's own cost per operation), `--ctx N` puts attention over an N-position KV cache between
# QKV and O, `--cell-rate` measures the consumers' arithmetic alone (no ring, no chain), `--skew`
# records every SM's input-ready and publish times for one step (the slowest SM per operation),
# `--chunks N` keeps the N-chunk rings only, PROTO_COPY=bulk|
# cp.async|both the producers' copy engine (default bulk where there is TMA), PROTO_BALANCE=0
# keeps tiles whole (by default they are split along K so every SM streams about the same bytes
# per operation).
# PROTO_BUILD_ONLY=1 builds and stops; PROTO_REUSE=1 keeps a binary built earlier (device
# time: one parallel build of every configuration instead of one per call).
# docs/performance.md records what it measured.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvcc="${NVCC:-nvcc}"
arch="${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)}"
builds=(${BUILDS:-A8=1})
pids=()
for b in "${builds[@]}"; do
  bin="${TMPDIR:-/tmp}/stream_step_${b//[=,]/_}"
  [ "${PROTO_REUSE:-0}" = 1 ] && [ -x "$bin" ] && continue
  defs=(); IFS=, read -ra kv <<< "$b"; for d in "${kv[@]}"; do defs+=("-D$d"); done
  "$nvcc" -O3 -std=c++17 -arch="sm_${arch:-90}" "${defs[@]}" -o "$bin" "$root/crates/hayai-cuda/proto/stream_step.cu" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "error: a build failed" >&2; exit 1; }; done
[ "${PROTO_BUILD_ONLY:-0}" = 1 ] && exit 0
rc=0
for b in "${builds[@]}"; do echo "### build $b"; "${TMPDIR:-/tmp}/stream_step_${b//[=,]/_}" "$@" || rc=$?; done
exit $rc
