#!/usr/bin/env bash
# Where the streamed-step prototype's consumers spend their time (run on the GPU machine after
# scripts/proto-stream.sh has built BUILD): Nsight Compute's source counters (stall samples and
# executed instructions per SASS line) for one launch, by default in "cells only" mode (no
# copies, no input reads: the consumers' own work); PROTO_MODES=0 profiles the full chain (as
# the tenth session did: 10.7 cycles per issued instruction, 32% of stall samples at barriers).
#   scripts/proto-profile.sh [BUILD] [prototype args...]   (BUILD as in BUILDS, default A8=1)
#   -> $OUT/cells.txt (sections), $OUT/cells.csv (per SASS line)
set -uo pipefail
out="${OUT:-$PWD/out}"; mkdir -p "$out"
b="${1:-A8=1}"; shift || true
bin="${TMPDIR:-/tmp}/stream_step_${b//[=,]/_}"
[ -x "$bin" ] || { echo "build it first: BUILDS=$b scripts/proto-stream.sh" >&2; exit 2; }
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu_bin" ] || { echo "no ncu on this machine" >&2; exit 2; }
# Launches: 3 warm-up, then the timed one (profiled).
PROTO_MODES="${PROTO_MODES:-4}" timeout "${NCU_TIMEOUT:-200}" "$ncu_bin" --clock-control none -f -o "$out/cells" \
  -k regex:stream_step --launch-skip 3 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section InstructionStats --section SpeedOfLight \
  "$bin" --iters 1 "$@" > "$out/ncu.log" 2>&1
echo "ncu rc=$?"
"$ncu_bin" --import "$out/cells.ncu-rep" --page details > "$out/cells.txt" 2>&1
"$ncu_bin" --import "$out/cells.ncu-rep" --page source --csv --print-source sass > "$out/cells.csv" 2>&1
grep -E "Duration|Warp Cycles Per Issued|Executed Instructions  " "$out/cells.txt"
